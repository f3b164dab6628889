"""Model fingerprint: which peers hold the same architecture and may average weights.

Shared by the node (to label its policy) and by outer sync (every sync key
carries it), so two peers sync together only if their parameter names, shapes
and dtypes are identical.
"""

from __future__ import annotations

import hashlib

import torch


def model_fingerprint(module: torch.nn.Module) -> str:
    """16 hex chars of sha256 over the (name, shape, dtype) of every parameter, in order.

    >>> a, b = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)
    >>> model_fingerprint(a) == model_fingerprint(b) != model_fingerprint(torch.nn.Linear(4, 3))
    True
    >>> len(model_fingerprint(a))
    16
    """
    h = hashlib.sha256(b"swarm-node/fingerprint/v1\n")
    for name, param in module.named_parameters():
        h.update(f"{name}|{tuple(param.shape)}|{param.dtype}\n".encode())
    return h.hexdigest()[:16]
