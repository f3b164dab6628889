"""Where a model runs (``--device``) and a digest of its weights."""

from __future__ import annotations

import hashlib

import torch


def resolve_device(name: str) -> str:
    """``auto`` picks cuda, then mps, then cpu; an explicit device must exist."""
    if name == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but no CUDA device is visible; use --device cpu")
    if name == "mps" and not torch.backends.mps.is_available():
        raise ValueError("--device mps was asked for but MPS is not available; use --device cpu")
    return name


def params_digest(module: torch.nn.Module) -> str:
    """sha256 (16 hex) of all parameter bytes: tells whether training changed the weights."""
    h = hashlib.sha256()
    for name, p in sorted(module.named_parameters()):
        h.update(name.encode())
        h.update(p.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]
