"""Sampling at the speed of the hardware: one prefill per prompt, low-precision weights where they are fast.

A round samples G completions of each of I prompts. Two things dominate its time on a CPU:

- **The prompt's prefill, G times over.** Every completion of one prompt starts from the same
  prompt tokens, so the prompt runs through the model once and its KV cache is repeated for the G
  rows (:func:`sample_tokens`); the rows then decode in one batch. A prompt of 55 tokens with G = 4 and
  16 new tokens is three quarters of a round's FLOPs when prefilled per row.
- **float32 matrix products at small batch.** On a CPU with native bfloat16 instructions
  (AVX512-BF16 or AMX), a bf16 product runs about 3x the float32 rate at the shapes of a decode step
  (bench/bench_rollout.py prints both). :class:`LowPrecisionCopy` keeps a bf16 copy of the model
  for sampling: the trained weights (float32, the optimiser's) are copied into it before each
  sampling call, the frozen ones (a LoRA base) once. Training and scoring stay float32.

A completion's *behaviour log-probability* (what a publisher claims, see
:meth:`node.training.policy.Policy.sequence_logprobs`) is read off the logits the completion was drawn
from, at temperature 1, when the completion's text re-tokenises to the sampled ids and it ended with
eos: that is the probability under the distribution that produced it, without a second pass. Other
rows (a BPE text that re-tokenises differently, a completion cut at ``max_new_tokens``) get None and
are scored by the caller.

``sample_precision="auto"`` samples in bf16 only where it pays and is measured: a CPU whose flags
name native bf16, a model of at least :data:`MIN_LOW_PRECISION_PARAMS` parameters (a built-in tiny
model's step is per-call overhead, which bf16 does not shorten) that trains an adapter (see
:func:`sampling_dtype`).
The same seed, weights and prompts give the same completions in either precision.
"""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from node.training.configs import PRECISIONS as PRECISIONS

logger = logging.getLogger(__name__)

MIN_LOW_PRECISION_PARAMS = 10_000_000
"""Below this many parameters ``auto`` samples in float32 (per-call overhead dominates a step)."""

NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


@functools.cache
def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU's flags name a native bfloat16 instruction set (Linux; False where unknown)."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            return bool(NATIVE_BF16_FLAGS & set(line.split(":", 1)[-1].split()))
    return False


def sampling_dtype(
    precision: str, device: torch.device, n_params: int, adapted: bool, native_bf16: bool
) -> torch.dtype | None:
    """The dtype of the sampling copy, or None to sample with the training weights themselves.

    Only a CPU gets a copy: a CUDA device already computes in bf16 under autocast (see
    :func:`node.training.policy.default_compute_dtype`). ``auto`` also wants ``adapted`` (the trained
    weights are an adapter on a frozen base): an adapter's update is its own product, so bf16 keeps it
    to 3 significant digits, while a fully fine-tuned weight's update (2e-6 a step for SmolLM2) is
    below bf16's resolution of the weight itself (2^-9 of it), and that path is not measured.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if device.type != "cpu" or precision == "float32":
        return None
    if precision == "bfloat16" or (native_bf16 and adapted and n_params >= MIN_LOW_PRECISION_PARAMS):
        return torch.bfloat16
    return None


class LowPrecisionCopy:
    """A copy of a model in ``dtype`` for sampling, brought up to date with the model on each :meth:`get`.

    Built without a transient float32 duplicate (each parameter is converted as it is copied).
    Parameters that train (``requires_grad``) are copied at every :meth:`get`: whatever changed them
    (an optimiser step, an outer sync, a checkpoint restore) the copy cannot go stale; frozen ones
    only when built. A LoRA adapter is merged into the copy (``W + scale * B @ A``, computed in
    float32 from the live adapter at every :meth:`get`): its low-rank products, two per target module
    and layer, would cost a decode step more than they compute. Attention in the copy reads each
    key/value head once (:func:`grouped_attention`).
    """

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype) -> None:
        self.source = model
        self.dtype = dtype
        self._copy: Any = None
        self._pairs: list[tuple[Tensor, Tensor]] = []
        self._merged: list[tuple[Any, Tensor]] = []  # (source LoRA layer, the copy's merged weight)

    def _build(self) -> Any:
        params = list(self.source.parameters())
        memo: dict[int, Any] = {
            id(p): torch.nn.Parameter(p.detach().to(self.dtype, copy=True), requires_grad=False) for p in params
        }
        clone: Any = copy.deepcopy(self.source, memo)
        layers = lora_layers(self.source)
        if layers is not None:
            clone = clone.merge_and_unload()
            self._merged = [(layer, clone.get_submodule(name).weight) for name, layer in layers]
            self._pairs = []
        else:
            self._pairs = [(p, memo[id(p)]) for p in params if p.requires_grad]
        clone.eval()
        base = clone.get_base_model() if hasattr(clone, "get_base_model") else clone
        _use_grouped_attention(base)
        head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
        if isinstance(head, torch.nn.Module):
            head.register_forward_pre_hook(_contiguous_input)
        return clone

    @torch.no_grad()
    def get(self) -> Any:
        """The copy, with the model's trainable weights as they are now."""
        if self._copy is None:
            self._copy = self._build()
        for src, dst in self._pairs:
            dst.copy_(src)
        for layer, dst in self._merged:
            delta = sum(layer.get_delta_weight(name) for name in layer.active_adapters)
            dst.copy_(layer.base_layer.weight.float() + delta)
        return self._copy


def lora_layers(model: torch.nn.Module) -> list[tuple[str, Any]] | None:
    """A peft LoRA model's adapted layers, named as in the merged model; None unless only LoRA weights train.

    (Another trained weight, e.g. peft's ``modules_to_save``, is copied as it is, unmerged.)
    """
    if not hasattr(model, "merge_and_unload"):
        return None
    layers = [
        (name, m) for name, m in model.named_modules() if hasattr(m, "get_delta_weight") and hasattr(m, "base_layer")
    ]
    adapted = {id(p) for _, m in layers for n, p in m.named_parameters() if n.startswith(("lora_A", "lora_B"))}
    if not layers or any(p.requires_grad and id(p) not in adapted for p in model.parameters()):
        return None
    prefix = "base_model.model."
    return [(name.removeprefix(prefix), m) for name, m in layers]


GROUPED_ATTENTION = "swarm_grouped"
"""The sampling copy's attention kernel (registered with transformers when a copy is first built)."""


def grouped_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **_: Any,
) -> tuple[Tensor, None]:
    """Eager attention that reads each key/value head once for its group of query heads.

    transformers' eager kernel first copies every key/value head once per query head of its group
    (``repeat_kv``: the whole KV cache, 3x for SmolLM2, at every decode step); here a group's query
    heads are rows of one product against their shared head. Same result; query head ``h`` belongs to
    key/value head ``h // group``, as in ``repeat_kv``.
    """
    b, heads, q, d = query.shape
    kv_heads, length = key.shape[1], key.shape[-2]
    group = heads // kv_heads
    scores = torch.matmul(query.reshape(b, kv_heads, group * q, d), key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores.view(b, kv_heads, group, q, length) + attention_mask[:, :, None, :, :length]
        scores = scores.view(b, kv_heads, group * q, length)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(probs, value).view(b, heads, q, d)
    return out.transpose(1, 2).contiguous(), None


def _use_grouped_attention(model: Any) -> None:
    """Point ``model``'s attention at :func:`grouped_attention` (a model that refuses keeps its own)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(GROUPED_ATTENTION, grouped_attention)
    AttentionMaskInterface.register(GROUPED_ATTENTION, eager_mask)
    try:
        model.set_attn_implementation(GROUPED_ATTENTION)
    except (AttributeError, ValueError, ImportError) as e:
        logger.debug("sampling copy keeps its attention kernel: %s", e)


def _contiguous_input(_module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The output layer's input made contiguous: a prefill's last-position slice [B, 1, H] is a strided
    view, and a bf16 product with a strided 3-d input on a CPU broadcasts the weight into a batched
    product (a copy of the whole output layer per row: seconds for a 49k vocabulary)."""
    return (args[0].contiguous(), *args[1:])


@dataclass(frozen=True)
class TokenLimits:
    """What a row may sample: ids never drawn, the vocabulary's end, eos and padding."""

    banned: Tensor
    vocab_size: int
    eos_id: int
    pad_id: int


@dataclass(frozen=True)
class Sampled:
    """Rows of sampled ids ([R, T], ``pad_id`` after eos) with each token's log-probability at temperature 1."""

    ids: Tensor
    logprobs: Tensor
    ended: Tensor  # [R] bool: the row sampled eos
    eos_after: Tensor | None = None  # [R]: eos's log-probability after a row cut at the limit (``finish``)


def pad_left(seqs: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Left-padded ids and attention mask of ``seqs``."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s) :] = torch.tensor(list(s), dtype=torch.long)
        mask[i, width - len(s) :] = 1
    return ids.to(device), mask.to(device)


@torch.no_grad()
def sample_tokens(
    model: Any,
    prompts: Sequence[Sequence[int]],
    repeats: int,
    max_new_tokens: int,
    draw: Callable[[Tensor], Tensor],
    limits: TokenLimits,
    stop: Callable[[], bool] = lambda: False,
    finish: bool = False,
) -> Sampled:
    """``repeats`` rows per prompt (rows of one prompt adjacent): one prefill per prompt, then one batch.

    ``draw`` maps masked logits [R, V] (float32) to one id per row. Each drawn token's log-probability is
    taken from the raw logits (no ban, no temperature): the policy's own probability, as a scoring pass
    computes it. ``stop`` is polled between tokens. With ``finish``, rows still open at the limit get one
    more pass for eos's log-probability (a scoring pass scores their text followed by eos).
    """
    device = limits.banned.device
    rows = len(prompts) * repeats
    out = torch.full((rows, max_new_tokens), limits.pad_id, dtype=torch.long, device=device)
    logp = torch.zeros((rows, max_new_tokens), dtype=torch.float32, device=device)
    done = torch.zeros(rows, dtype=torch.bool, device=device)
    if stop():  # leaving: a long generation must not outlast the leave bound
        return Sampled(out, logp, done)
    ids, mask = pad_left(prompts, limits.pad_id, device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    res = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
    index = torch.arange(len(prompts), device=device).repeat_interleave(repeats)
    past = res.past_key_values
    if repeats > 1:
        past.batch_select_indices(index)
    logits = res.logits[:, -1, :].float()[index]
    mask, positions = mask[index], positions[index][:, -1:]
    for step in range(max_new_tokens):
        raw = logits.clone()
        logits[:, limits.banned] = float("-inf")
        logits[:, limits.vocab_size :] = float("-inf")
        nxt = draw(logits).masked_fill(done, limits.pad_id)
        logp[:, step] = (raw.gather(-1, nxt[:, None]).squeeze(-1) - torch.logsumexp(raw, -1)).masked_fill(done, 0.0)
        out[:, step] = nxt
        done |= nxt == limits.eos_id
        last = step + 1 == max_new_tokens
        if bool(done.all()) or stop() or (last and not finish):
            return Sampled(out, logp, done)
        mask = torch.cat([mask, torch.ones((rows, 1), dtype=mask.dtype, device=device)], dim=1)
        positions = positions + 1
        res = model(
            input_ids=nxt[:, None], attention_mask=mask, position_ids=positions,
            past_key_values=past, use_cache=True, logits_to_keep=1,
        )  # fmt: skip
        past = res.past_key_values
        logits = res.logits[:, -1, :].float()
        if last:
            return Sampled(out, logp, done, torch.log_softmax(logits, dim=-1)[:, limits.eos_id])
    return Sampled(out, logp, done)
