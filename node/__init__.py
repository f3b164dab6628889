"""The swarm-node node: what a volunteer runs on top of :mod:`swarm` and :mod:`protocol`.

Subpackages, from the bottom up (a module imports only from its own
subpackage, from a lower one, or from :mod:`swarm` / :mod:`protocol`;
``tests/test_layers.py`` enforces it):

- :mod:`node.observe` — logging context, the metrics event file, reachability advice;
- :mod:`node.tasks` — verifiable task families, answer extraction, re-verification of peers' groups;
- :mod:`node.training` — models, tokenizer, the policy and the GRPO trainer;
- :mod:`node.core` — the node and its round, its configuration, pool, checkpoints, round record;
- :mod:`node.dashboard` and :mod:`node.experiments` — read what nodes write;
- :mod:`node.cli` — the ``swarm-node`` command, generated from the config dataclasses.

See docs/ARCHITECTURE.md.
"""
