"""Flat float32 vectors: slicing, compression (none / fp16 / int8), reduction, hashing.

Everything here is deterministic on its input bytes: a decoded slice depends
only on the bytes received, so members that receive the same bytes hold
bit-identical floats.
"""

from __future__ import annotations

import hashlib
import sys
from typing import TypeAlias

import numpy as np
import torch

from swarm.sync.config import COMPRESSIONS
from swarm.sync.errors import BadBytes
from swarm.sync.robust import aggregate, as_array

Buffer: TypeAlias = "bytes | bytearray | memoryview"
"""Bytes on the wire: a ``bytes`` object or a (read-only) view of an array's memory."""
LITTLE_ENDIAN = sys.byteorder == "little"

INT8_CHUNK = 4096
"""Elements sharing one float32 scale under int8 compression."""
FP16_MAX = 65504.0
"""Largest finite float16: larger values are clamped to it before rounding, so they stay finite."""


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


def encode_view(x: torch.Tensor, compression: str) -> Buffer:
    """Encode a 1-D float32 tensor; refuses non-finite values (BadBytes).

    With ``none`` on a little-endian machine the result is a read-only view of
    ``x``'s own memory (no copy: the caller must not change ``x`` while it is sent).
    """
    a = as_array(x)
    if not bool(np.isfinite(a).all()):
        raise BadBytes("non-finite values in a tensor to send")
    if compression == "none":
        if not LITTLE_ENDIAN:  # the wire is little-endian
            return a.astype("<f4").tobytes()
        return a.data.cast("B").toreadonly()
    if compression == "fp16":
        return _encode_fp16(a)
    if compression != "int8":
        raise ValueError(f"compression={compression!r}; use one of {COMPRESSIONS}")
    return _encode_int8(a)


def _encode_fp16(a: np.ndarray) -> Buffer:
    if not LITTLE_ENDIAN:  # the wire is little-endian: numpy's explicit dtype, no fast path
        half: bytes = np.clip(a, -FP16_MAX, FP16_MAX).astype("<f2").tobytes()
        return half
    # torch's float32 -> float16 copy into an existing buffer is vectorised (numpy's astype measured 40x
    # slower); both round to nearest even, and only the sender rounds: every receiver decodes exactly
    out = np.empty(a.size, dtype=np.float16)
    src = torch.from_numpy(a)
    if a.size and max(-float(a.min()), float(a.max())) > FP16_MAX:
        src = src.clamp(-FP16_MAX, FP16_MAX)
    torch.from_numpy(out).copy_(src)
    return out.data.cast("B")


def _encode_int8(a: np.ndarray) -> Buffer:
    """Per chunk of ``INT8_CHUNK``: a float32 scale (|x| max / 127, 1 for an all-zero chunk), then
    round(x / scale) clipped to [-127, 127], computed in place."""
    n = a.size
    n_chunks = -(-n // INT8_CHUNK)
    out = np.empty(4 * n_chunks + n, dtype=np.uint8)
    padded = np.zeros(n_chunks * INT8_CHUNK, dtype=np.float32)
    padded[:n] = a
    chunks = padded.reshape(n_chunks, INT8_CHUNK)
    scales = np.maximum(chunks.max(axis=1), -chunks.min(axis=1))  # |x| max without an |x| copy
    np.divide(scales, np.float32(127.0), out=scales)
    scales[scales <= 0] = np.float32(1.0)
    np.divide(chunks, scales[:, None], out=chunks)
    np.rint(chunks, out=chunks)
    np.clip(chunks, -127, 127, out=chunks)
    out[: 4 * n_chunks] = scales.astype("<f4", copy=False).view(np.uint8)
    out[4 * n_chunks :] = padded[:n].astype(np.int8).view(np.uint8)
    return out.data.cast("B")


def encode(x: torch.Tensor, compression: str) -> bytes:
    """:func:`encode_view` as ``bytes`` (a copy for ``none``)."""
    return bytes(encode_view(x, compression))


def decode_into(data: Buffer, out: np.ndarray, compression: str) -> None:
    """Decode bytes from :func:`encode` into the float32 array ``out`` (BadBytes if malformed or not finite)."""
    n = out.size
    if len(memoryview(data).cast("B")) != encoded_size(n, compression):
        raise BadBytes(f"expected {encoded_size(n, compression)} bytes for {n} elements, got {len(data)}")
    if compression == "none":
        np.copyto(out, np.frombuffer(data, dtype="<f4"))
    elif compression == "fp16":
        half = np.frombuffer(data, dtype="<f2")
        if LITTLE_ENDIAN and half.flags.writeable:  # torch's vectorised copy (torch refuses read-only memory)
            torch.from_numpy(out).copy_(torch.from_numpy(half))
        else:
            np.copyto(out, half)
    else:
        n_chunks = -(-n // INT8_CHUNK)
        scales = np.frombuffer(data, dtype="<f4", count=n_chunks).astype(np.float32)
        q = np.frombuffer(data, dtype=np.int8, offset=4 * n_chunks)
        whole = (n // INT8_CHUNK) * INT8_CHUNK
        # one float32 multiply per element, as before: q x its chunk's scale
        np.multiply(
            q[:whole].reshape(-1, INT8_CHUNK),
            scales[: whole // INT8_CHUNK, None],
            out=out[:whole].reshape(-1, INT8_CHUNK),
        )
        if whole < n:
            np.multiply(q[whole:], scales[-1], out=out[whole:])
    if not bool(np.isfinite(out).all()):
        raise BadBytes("non-finite values received")


def decode(data: Buffer, n: int, compression: str) -> torch.Tensor:
    """Decode bytes from :func:`encode` into a new float32 tensor of ``n`` elements (BadBytes if not)."""
    out = np.empty(n, dtype=np.float32)
    decode_into(data, out, compression)
    return torch.from_numpy(out)


def reduce_parts(parts: list[torch.Tensor], n: int, aggregator: str, trim_fraction: float) -> torch.Tensor:
    """Combine equal-length parts with ``aggregator`` (no norm clipping; see :mod:`swarm.sync.robust`)."""
    return aggregate(parts, n, aggregator, trim_fraction)


def state_hash(anchor: torch.Tensor, momentum: torch.Tensor, origin: str = "") -> str:
    """sha256 hex of the anchor and outer momentum (float32, little-endian), and of the history's ``origin``.

    The origin (:func:`swarm.sync.merge.next_origin`) is hashed so that a state's hash names its history
    too: a donor cannot serve a state under another history's name. A state with no origin (revision 0)
    hashes as the anchor and momentum alone.
    """
    h = hashlib.sha256(b"swarm-node/state/v1\n")
    for t in (anchor, momentum):
        h.update(as_array(t).astype("<f4", copy=False).data.cast("B"))
    if origin:
        h.update(b"\norigin:" + origin.encode())
    return h.hexdigest()


def to_bytes(t: torch.Tensor) -> bytes:
    """float32 little-endian bytes of a 1-D tensor."""
    return as_array(t).astype("<f4", copy=False).tobytes()


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
        params = float_params(module)
        if all(p.dtype == torch.float32 and p.device.type == "cpu" for p in params):
            # numpy's large allocations fault in far fewer pages than torch.cat's (hugepages): 4x faster at 40 MB
            return torch.from_numpy(np.concatenate([p.detach().reshape(-1).numpy() for p in params]))
        return torch.cat([p.detach().reshape(-1).to(torch.float32) for p in params])


def load_flat(module: torch.nn.Module, flat: torch.Tensor) -> None:
    """Copy a flat float32 vector into the parameters (cast to each one's dtype)."""
    offset = 0
    with torch.no_grad():
        for p in float_params(module):
            n = p.numel()
            p.copy_(flat[offset : offset + n].view_as(p).to(p.dtype))
            offset += n


STEP_CHUNK = 1 << 20
"""Values per piece of the Nesterov step's temporary (4 MB), so the step needs no third model-sized vector."""


def outer_step(
    anchor: torch.Tensor,
    momentum: torch.Tensor,
    grad: torch.Tensor,
    lr: float,
    mu: float,
    nesterov: bool,
    consume_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SGD with (Nesterov) momentum, as torch.optim.SGD computes it; returns new tensors.

    With ``mu`` 0 the returned momentum is empty (the state keeps none: see
    :meth:`swarm.sync.config.OuterSyncConfig.momentum_elems`) and ``momentum`` is not read.

    Each operation is a separately rounded float32 numpy ufunc (no fused
    multiply-add), so the result is the same bits on any IEEE machine.
    ``consume_grad``: the new anchor is computed in ``grad``'s own memory (it
    is overwritten), so plain averaging allocates nothing and a momentum step
    only the new momentum; otherwise the step copies ``grad`` first.
    """
    g = as_array(grad) if consume_grad else as_array(grad).copy()
    a = as_array(anchor)
    mu32, lr32 = np.float32(mu), np.float32(lr)
    with np.errstate(over="ignore"):  # an overflow gives inf, which the caller's step check refuses
        if mu == 0:  # the same bits as below with mu 0 (m = g, and Nesterov adds 0 m)
            np.multiply(g, lr32, out=g)
            np.subtract(a, g, out=g)
            return torch.from_numpy(g), torch.zeros(0, dtype=torch.float32)
        # the same roundings in the same order as the plain expressions
        m = np.multiply(as_array(momentum), mu32)
        np.add(m, g, out=m)
        for start in range(0, g.size, STEP_CHUNK):
            part, mp, ap = g[start : start + STEP_CHUNK], m[start : start + STEP_CHUNK], a[start : start + STEP_CHUNK]
            if nesterov:
                np.add(part, np.multiply(mp, mu32), out=part)
                np.multiply(part, lr32, out=part)
            else:
                np.multiply(mp, lr32, out=part)
            np.subtract(ap, part, out=part)
    return torch.from_numpy(g), torch.from_numpy(m)
