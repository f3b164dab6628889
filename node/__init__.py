"""swarm-node: the training node (CLI, policies, tasks, trainer, metrics)."""
