"""Training: the model registry and cache, the tokenizer, the policy (generation, log-probs) and GRPO.

Owns torch. Knows nothing of the network or of how a round is scheduled.
"""
