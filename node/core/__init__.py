"""The node and its round: configuration, collaborators, ingest of external groups, the pool, checkpoints.

:class:`~node.core.node.Node` receives its network collaborators from a
factory and a clock, so a whole round runs in-process in tests with a fake
exchange (``tests/node/test_round.py``).
"""
