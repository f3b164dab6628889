"""swarm-node: the networked layer on hivemind (identity, membership, rollout exchange, sync)."""
