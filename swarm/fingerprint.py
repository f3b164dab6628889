"""Model fingerprint: which peers hold the same architecture and may average weights.

Shared by the node (to label its policy) and by outer sync (every sync key
carries it), so two peers sync together only if their parameter names, shapes
and dtypes are identical, and, for a model that trains an adapter on a frozen
base, only if its base and adapter settings are too (:data:`IDENTITY_ATTR`).
"""

from __future__ import annotations

import hashlib

import torch

IDENTITY_ATTR = "swarm_identity"
"""A model may carry, as a ``str`` attribute of this name, what its trainable parameters do not show:
an adapter node (:mod:`node.training.adapters`) records its frozen base's weight hash and its adapter
settings here. Kept on the model so that everything that fingerprints the model sees it."""


def model_fingerprint(module: torch.nn.Module) -> str:
    """16 hex chars of sha256 over the (name, shape, dtype) of every parameter, in order.

    A model with an identity (:data:`IDENTITY_ATTR`) is fingerprinted by its trainable parameters
    (what outer sync averages) and that identity instead: its frozen base is covered by the
    identity's weight hash, whatever dtype this peer stores it in. Without one (full fine-tuning)
    every parameter counts, as always.

    >>> a, b = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)
    >>> model_fingerprint(a) == model_fingerprint(b) != model_fingerprint(torch.nn.Linear(4, 3))
    True
    >>> len(model_fingerprint(a))
    16
    """
    h = hashlib.sha256(b"swarm-node/fingerprint/v1\n")
    identity = getattr(module, IDENTITY_ATTR, None)
    for name, param in module.named_parameters():
        if identity is None or param.requires_grad:
            h.update(f"{name}|{tuple(param.shape)}|{param.dtype}\n".encode())
    if identity is not None:
        h.update(f"identity|{identity}\n".encode())
    return h.hexdigest()[:16]


def sync_fingerprint(model: str, rule: str) -> str:
    """The outer sync's namespace: 16 hex chars of sha256 over a model fingerprint and an outer rule.

    Peers sync together only if both agree: the architecture (:func:`model_fingerprint`) and how a
    round turns parts into a state (:meth:`swarm.sync.config.OuterSyncConfig.rule`).

    >>> sync_fingerprint("0" * 16, "outer_lr=0.7") == sync_fingerprint("0" * 16, "outer_lr=0.7")
    True
    >>> sync_fingerprint("0" * 16, "outer_lr=0.7") != sync_fingerprint("0" * 16, "outer_lr=1.0")
    True
    """
    return hashlib.sha256(f"{model}|{rule}".encode()).hexdigest()[:16]
