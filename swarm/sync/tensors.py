"""Flat float32 vectors: slicing, compression (none / fp16 / int8), reduction, hashing.

Everything here is deterministic on its input bytes: a decoded slice depends
only on the bytes received, so members that receive the same bytes hold
bit-identical floats.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from swarm.sync.config import COMPRESSIONS
from swarm.sync.errors import BadBytes
from swarm.sync.robust import aggregate

INT8_CHUNK = 4096
"""Elements sharing one float32 scale under int8 compression."""


def slice_bounds(n_elems: int, n_slices: int) -> list[tuple[int, int]]:
    """Cut ``n_elems`` into ``n_slices`` contiguous, nearly equal ranges.

    >>> slice_bounds(10, 3)
    [(0, 4), (4, 7), (7, 10)]
    """
    base, extra = divmod(n_elems, n_slices)
    bounds, start = [], 0
    for i in range(n_slices):
        end = start + base + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def encoded_size(n: int, compression: str) -> int:
    """Bytes :func:`encode` produces for ``n`` elements.

    >>> encoded_size(4097, "int8"), encoded_size(3, "fp16")
    (4105, 6)
    """
    if compression == "none":
        return 4 * n
    if compression == "fp16":
        return 2 * n
    if compression == "int8":
        return 4 * (-(-n // INT8_CHUNK)) + n
    raise ValueError(f"compression={compression!r}; use one of {COMPRESSIONS}")


def encode(x: torch.Tensor, compression: str) -> bytes:
    """Encode a 1-D float32 tensor; refuses non-finite values (BadBytes)."""
    x = x.detach().to(torch.float32).contiguous()
    if not bool(torch.isfinite(x).all()):
        raise BadBytes("non-finite values in a tensor to send")
    if compression == "none":
        return x.numpy().astype("<f4", copy=False).tobytes()
    if compression == "fp16":
        return x.clamp(-65504.0, 65504.0).numpy().astype("<f2").tobytes()
    if compression != "int8":
        raise ValueError(f"compression={compression!r}; use one of {COMPRESSIONS}")
    n = x.numel()
    n_chunks = -(-n // INT8_CHUNK)
    padded = torch.zeros(n_chunks * INT8_CHUNK, dtype=torch.float32)
    padded[:n] = x
    chunks = padded.view(n_chunks, INT8_CHUNK)
    scales = chunks.abs().amax(dim=1) / 127.0
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.round(chunks / scales[:, None]).clamp(-127, 127).to(torch.int8).view(-1)[:n]
    return scales.numpy().astype("<f4").tobytes() + q.numpy().tobytes()


def decode(data: bytes, n: int, compression: str) -> torch.Tensor:
    """Decode bytes from :func:`encode` into a new float32 tensor of ``n`` elements (BadBytes if not)."""
    if len(data) != encoded_size(n, compression):
        raise BadBytes(f"expected {encoded_size(n, compression)} bytes for {n} elements, got {len(data)}")
    if compression == "none":
        out = torch.from_numpy(np.frombuffer(data, dtype="<f4").astype(np.float32))
    elif compression == "fp16":
        out = torch.from_numpy(np.frombuffer(data, dtype="<f2").astype(np.float32))
    else:
        n_chunks = -(-n // INT8_CHUNK)
        scales = torch.from_numpy(np.frombuffer(data, dtype="<f4", count=n_chunks).astype(np.float32))
        q = torch.from_numpy(np.frombuffer(data, dtype=np.int8, offset=4 * n_chunks).astype(np.float32))
        out = q * scales.repeat_interleave(INT8_CHUNK)[:n]
    if not bool(torch.isfinite(out).all()):
        raise BadBytes("non-finite values received")
    return out


def reduce_parts(parts: list[torch.Tensor], n: int, aggregator: str, trim_fraction: float) -> torch.Tensor:
    """Combine equal-length parts with ``aggregator`` (no norm clipping; see :mod:`swarm.sync.robust`)."""
    return aggregate(parts, n, aggregator, trim_fraction)


def state_hash(anchor: torch.Tensor, momentum: torch.Tensor) -> str:
    """sha256 hex of the anchor and outer momentum (float32, little-endian)."""
    h = hashlib.sha256(b"swarm-node/state/v1\n")
    for t in (anchor, momentum):
        h.update(t.contiguous().numpy().astype("<f4", copy=False).data.cast("B"))
    return h.hexdigest()


def to_bytes(t: torch.Tensor) -> bytes:
    """float32 little-endian bytes of a 1-D tensor."""
    return t.contiguous().numpy().astype("<f4", copy=False).tobytes()


def from_bytes(data: bytes, n: int) -> torch.Tensor:
    """Inverse of :func:`to_bytes` (BadBytes on a length mismatch)."""
    if len(data) != 4 * n:
        raise BadBytes(f"expected {4 * n} bytes, got {len(data)}")
    return torch.from_numpy(np.frombuffer(data, dtype="<f4").astype(np.float32))


def float_params(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters that outer sync averages, in module order: the trainable floating-point ones.

    Under full fine-tuning that is every floating-point parameter; with an adapter on a frozen base
    only the adapter's (the base never moves, and peers of one fingerprint share it).
    """
    return [p for _, p in module.named_parameters() if p.dtype.is_floating_point and p.requires_grad]


def flatten(module: torch.nn.Module) -> torch.Tensor:
    """The averaged parameters (:func:`float_params`) as one new float32 vector."""
    with torch.no_grad():
        return torch.cat([p.detach().reshape(-1).to(torch.float32) for p in float_params(module)])


def load_flat(module: torch.nn.Module, flat: torch.Tensor) -> None:
    """Copy a flat float32 vector into the parameters (cast to each one's dtype)."""
    offset = 0
    with torch.no_grad():
        for p in float_params(module):
            n = p.numel()
            p.copy_(flat[offset : offset + n].view_as(p).to(p.dtype))
            offset += n


def outer_step(
    anchor: torch.Tensor, momentum: torch.Tensor, grad: torch.Tensor, lr: float, mu: float, nesterov: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """SGD with (Nesterov) momentum, as torch.optim.SGD computes it; returns new tensors.

    Each operation is a separately rounded float32 numpy ufunc (no fused
    multiply-add), so the result is the same bits on any IEEE machine.
    """
    g = grad.numpy()
    mu32, lr32 = np.float32(mu), np.float32(lr)
    with np.errstate(over="ignore"):  # an overflow gives inf, which the caller's step check refuses
        m = np.add(np.multiply(momentum.numpy(), mu32), g)
        update = np.add(g, np.multiply(m, mu32)) if nesterov else m
        new_anchor = np.subtract(anchor.numpy(), np.multiply(update, lr32))
    return torch.from_numpy(new_anchor), torch.from_numpy(m)
