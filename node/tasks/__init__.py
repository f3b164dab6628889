"""Verifiable tasks: families, the registry, answer extraction, and re-verification of peers' groups.

Owns everything that decides whether a completion is right, and the
:class:`~node.tasks.verify.RejectReason` enum for every group a node refuses.
Pure: no network, no torch.
"""
