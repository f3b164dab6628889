"""The policy: batched sampling of completions and per-token log-probabilities.

Tokenisation contract (used by both :meth:`Policy.generate` and
:meth:`Policy.token_logprobs`): the prompt and the completion are tokenised
*separately* and their ids concatenated. The prompt goes through
:meth:`Policy.format_prompt` (the tokenizer's chat template when it has one)
and keeps the tokenizer's special tokens (e.g. ``<bos>``); the completion is
tokenised without special tokens and followed by ``eos``, which is scored, so
the policy learns to stop. Completions travel between nodes as decoded text,
so a receiver re-tokenises them with its own tokenizer; for a BPE tokenizer
the re-tokenised ids may differ from the sampled ones, which is inherent to
text-level rollout sharing.

Prompts longer than the model's context are cut from the left so that prompt
plus completion fit (``max_position_embeddings`` / ``n_positions``): a tiny
model with 256 positions can still score a long reasoning-gym question of its
own. A completion that leaves no room for even one prompt token raises
:class:`SequenceTooLong` (peers' groups that do not fit are refused earlier, by
the node's acceptance policy, and the trainer skips any that get through).
Weights stay float32; on a CUDA device with bfloat16 support forward passes
run under ``torch.autocast(bfloat16)`` (float32 master weights, so a small
learning rate is not rounded away as it would be in pure bf16). A model wrapped
with an adapter (:mod:`node.training.adapters`) is used the same way: peft passes
``position_ids``, ``past_key_values`` and ``logits_to_keep`` through to the base.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from node.training.configs import GenerationConfig as GenerationConfig
from node.training.sampler import (
    LowPrecisionCopy,
    Sampled,
    TokenLimits,
    cpu_has_native_bf16,
    sample_tokens,
    sampling_dtype,
)
from swarm.fingerprint import model_fingerprint

logger = logging.getLogger(__name__)


@dataclass
class TokenMeter:
    """Tokens through the model since the policy was made: what a round's tokens per second are read from."""

    sampled: int = 0  # completion tokens sampled, eos included
    sample_s: float = 0.0  # seconds inside sampling calls
    scored: int = 0  # prompt and completion tokens through scoring passes (training's included)


@dataclass(frozen=True)
class Completion:
    """One sampled completion: its text and, where the sampler knows it, its sequence log-probability."""

    text: str
    logprob: float | None


class SequenceTooLong(ValueError):
    """A completion that leaves no room for its prompt in the model's context (positions)."""


def sample_next(logits: Tensor, cfg: GenerationConfig, generator: torch.Generator) -> Tensor:
    """Sample one token id per row of ``logits`` [B, V] with temperature and top-p.

    By inverting each row's cumulative distribution at one uniform draw: one random number per row,
    where ``torch.multinomial`` draws one per vocabulary entry (40 ms a step for 32 rows of a 49k
    vocabulary on one core). A token of probability 0 is never drawn.
    """
    if cfg.temperature == 0.0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / cfg.temperature, dim=-1)
    if cfg.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        before = sorted_p.cumsum(dim=-1) - sorted_p  # mass strictly before each token
        sorted_p = sorted_p.masked_fill(before >= cfg.top_p, 0.0)  # always keeps the top token
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    cdf = probs.cumsum(dim=-1)
    u = torch.rand((probs.shape[0], 1), generator=generator, device=generator.device).to(probs.device)
    picked = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)
    return picked.squeeze(-1).clamp(max=probs.shape[-1] - 1).to(logits.device)


def default_compute_dtype(device: torch.device) -> torch.dtype | None:
    """bfloat16 on a CUDA device that supports it; None (float32 compute) on CPU, MPS and older GPUs."""
    if device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return None


def context_length(model: Any) -> int | None:
    """The model's maximum sequence length from its config, if it declares one."""
    cfg = getattr(model, "config", None)
    for key in ("max_position_embeddings", "n_positions"):
        value = getattr(cfg, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


class Policy:
    """A causal LM with its tokenizer: samples completions and scores them.

    ``compute_dtype`` is the autocast dtype of forward passes: ``"auto"`` picks
    :func:`default_compute_dtype` for ``device``; None computes in the weights' dtype.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        model_id: str,
        device: str = "cpu",
        max_batch_rows: int = 256,
        compute_dtype: torch.dtype | str | None = "auto",
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.device = torch.device(device)
        self.max_batch_rows = max_batch_rows
        # polled between generated tokens; the node points it at its stop event
        self.stop: Callable[[], bool] = lambda: False
        self.eos_id: int = int(tokenizer.eos_token_id)
        pad = tokenizer.pad_token_id
        self.pad_id: int = self.eos_id if pad is None else int(pad)
        # Never sample padding/bos/unk (they would vanish from the decoded text).
        banned = {tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.unk_token_id} - {None, self.eos_id}
        self._banned = torch.tensor(sorted(banned), dtype=torch.long, device=self.device)
        # Nor an id past the tokenizer's vocabulary: models pad their output layer (Qwen2.5: 151,936 logits
        # for 151,665 tokens), and such an id decodes to nothing.
        self.vocab_size: int = len(tokenizer)
        self.compute_dtype = default_compute_dtype(self.device) if compute_dtype == "auto" else compute_dtype
        self.max_length = context_length(model)
        self.n_params = sum(p.numel() for p in model.parameters())
        self._low: dict[torch.dtype, LowPrecisionCopy] = {}
        self.meter = TokenMeter()
        # scoring passes a run of rows with one prompt through it once (off: one pass per row, for comparison)
        self.share_prefill = True

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The mixed-precision context of forward passes (a no-op without a compute dtype)."""
        if isinstance(self.compute_dtype, torch.dtype):
            return torch.autocast(device_type=self.device.type, dtype=self.compute_dtype)
        return contextlib.nullcontext()

    def _fit(self, prompt_ids: list[int], room: int) -> list[int]:
        """Cut a prompt from the left so that ``room`` more tokens fit in the context."""
        if self.max_length is None or len(prompt_ids) + room <= self.max_length:
            return prompt_ids
        keep = max(1, self.max_length - room)
        return prompt_ids[-keep:]

    def fingerprint(self) -> str:
        """The model fingerprint (see :func:`model_fingerprint`)."""
        return model_fingerprint(self.model)

    # -- tokenisation ------------------------------------------------------------------
    def format_prompt(self, prompt: str) -> str:
        """The text the model sees for ``prompt``: the chat template's rendering if the tokenizer has one."""
        if getattr(self.tokenizer, "chat_template", None):
            messages = [{"role": "user", "content": prompt}]
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            return str(text)
        return prompt

    def encode_prompt(self, prompt: str) -> list[int]:
        """Token ids of the formatted prompt (special tokens included unless a chat template added them)."""
        templated = bool(getattr(self.tokenizer, "chat_template", None))
        ids = self.tokenizer(self.format_prompt(prompt), add_special_tokens=not templated)["input_ids"]
        if not ids:
            raise ValueError("prompt encodes to no tokens")
        return list(ids)

    def encode_completion(self, completion: str) -> list[int]:
        """Token ids of a completion, without special tokens, followed by eos."""
        return [*self.tokenizer(completion, add_special_tokens=False)["input_ids"], self.eos_id]

    def count_completion_tokens(self, completion: str) -> int:
        """Tokens of a completion's text (without the eos that :meth:`encode_completion` appends)."""
        return len(self.tokenizer(completion, add_special_tokens=False)["input_ids"])

    def count_prompt_tokens(self, prompt: str) -> int:
        """Tokens of the prompt as the model sees it (chat template and special tokens included)."""
        return len(self.encode_prompt(prompt))

    def fits(self, completion: str) -> bool:
        """Whether the completion (with eos) leaves room for at least one prompt token in the context."""
        return self.max_length is None or len(self.encode_completion(completion)) < self.max_length

    def _pad(self, seqs: list[list[int]], left: bool) -> tuple[Tensor, Tensor]:
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            sl = slice(width - len(s), width) if left else slice(0, len(s))
            ids[i, sl] = torch.tensor(s, dtype=torch.long)
            mask[i, sl] = 1
        return ids.to(self.device), mask.to(self.device)

    # -- sampling ------------------------------------------------------------------------
    def sampling_model(self, cfg: GenerationConfig) -> Any:
        """The model that samples under ``cfg.sample_precision``: the policy's own, or its low-precision copy."""
        adapted = any(not p.requires_grad for p in self.model.parameters())
        dtype = sampling_dtype(cfg.sample_precision, self.device, self.n_params, adapted, cpu_has_native_bf16())
        if dtype is None:
            return self.model
        low = self._low.get(dtype)
        if low is None:
            low = self._low[dtype] = LowPrecisionCopy(self.model, dtype)
            logger.info(
                "sampling in %s (a copy of the weights; training stays float32)", str(dtype).removeprefix("torch.")
            )
        return low.get()

    def _limits(self) -> TokenLimits:
        return TokenLimits(self._banned, self.vocab_size, self.eos_id, self.pad_id)

    def _claim(
        self, prompt: list[int], ids: list[int], logp: list[float], text: str, room: int, ended: float | bool
    ) -> float | None:
        """The sampled row's sequence log-probability, when a scoring pass of ``text`` would score these ids.

        ``ids`` are the sampled ones, eos included when the row drew it (``ended`` True). A row cut at the
        limit has no eos; ``ended`` is then eos's log-probability after it, if measured (a float: the eos a
        scoring pass appends), else False: no claim.
        """
        if ended is False:
            return None
        tail = 0.0 if ended is True else float(ended)
        full = ids if ended is True else [*ids, self.eos_id]
        if self.encode_completion(text) != full or self._fit(prompt, room) != self._fit(prompt, len(full)):
            return None
        return float(sum(logp[: len(ids)])) + tail

    def _decode(self, prompts: list[list[int]], n: int, sampled: Sampled, cfg: GenerationConfig) -> list[Completion]:
        done: list[Completion] = []
        after = sampled.eos_after.tolist() if sampled.eos_after is not None else None
        rows = zip(sampled.ids.tolist(), sampled.logprobs.tolist(), sampled.ended.tolist(), strict=True)
        for r, (row, lp, ended) in enumerate(rows):
            cut = row.index(self.eos_id) if self.eos_id in row else len(row)
            text = self.tokenizer.decode(row[:cut], skip_special_tokens=True)
            capped = not ended and cut == cfg.max_new_tokens and after is not None
            how: float | bool = True if ended else (after[r] if capped and after is not None else False)
            ids = row[: cut + 1] if ended else row[:cut]
            done.append(Completion(text, self._claim(prompts[r // n], ids, lp, text, cfg.max_new_tokens, how)))
            self.meter.sampled += len(ids)
        return done

    def sample(
        self,
        prompts: list[str],
        n: int,
        cfg: GenerationConfig,
        seed: int | torch.Generator | None = None,
        claims: bool = False,
    ) -> list[list[Completion]]:
        """Sample ``n`` completions for each prompt, with their behaviour log-probabilities where known.

        Each prompt is prefilled once and its ``n`` rows decode together, up to ``max_batch_rows`` rows per
        batch (see :mod:`node.training.sampler`); sampling stops at eos or after ``cfg.max_new_tokens``
        tokens; texts exclude eos and special tokens. ``seed`` is an int or a ``torch.Generator``
        (advanced by the call): the same seed, model and prompts give the same completions. ``claims``
        spends one more decode step on rows cut at the limit, so that they too get a log-probability.
        """
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if isinstance(seed, torch.Generator):
            gen = seed
        else:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(0 if seed is None else int(seed))
        t0 = time.perf_counter()
        model = self.sampling_model(cfg)
        encoded = [self._fit(self.encode_prompt(p), cfg.max_new_tokens) for p in prompts]
        out: list[list[Completion]] = []
        for start in range(0, len(encoded), max(1, self.max_batch_rows // n)):
            chunk = encoded[start : start + max(1, self.max_batch_rows // n)]
            if n <= self.max_batch_rows:
                rows = self._sample_batch(model, chunk, n, cfg, gen, claims)
                out += [rows[i * n : (i + 1) * n] for i in range(len(chunk))]
                continue
            rows = []  # one prompt's n rows, in batches of max_batch_rows
            for left in range(n, 0, -self.max_batch_rows):
                rows += self._sample_batch(model, chunk, min(left, self.max_batch_rows), cfg, gen, claims)
            out.append(rows)
        self.meter.sample_s += time.perf_counter() - t0
        return out

    def _sample_batch(
        self, model: Any, prompts: list[list[int]], n: int, cfg: GenerationConfig, gen: torch.Generator, claims: bool
    ) -> list[Completion]:
        def draw(logits: Tensor) -> Tensor:
            return sample_next(logits, cfg, gen)

        with self.autocast():
            sampled = sample_tokens(model, prompts, n, cfg.max_new_tokens, draw, self._limits(), self.stop, claims)
        return self._decode(prompts, n, sampled, cfg)

    def generate(
        self, prompts: list[str], n: int, cfg: GenerationConfig, seed: int | torch.Generator | None = None
    ) -> list[list[str]]:
        """The texts of :meth:`sample`: one list of ``n`` completions per prompt."""
        return [[c.text for c in row] for row in self.sample(prompts, n, cfg, seed)]

    # -- scoring -------------------------------------------------------------------------
    def token_logprobs(self, prompts: list[str], completions: list[str]) -> tuple[Tensor, Tensor]:
        """Log-probabilities of each completion's tokens (eos included) given its prompt, with grad.

        Returns ``(logp, mask)``, both [B, T] with T the longest completion in
        tokens; ``mask`` is 1.0 on real completion tokens and 0.0 on padding
        (where ``logp`` is 0). Prompts are left-padded and completions
        right-padded, so every completion starts at the same column.
        """
        if len(prompts) != len(completions) or not prompts:
            raise ValueError("need as many prompts as completions, at least one")
        c_seqs = [self.encode_completion(c) for c in completions]
        if self.max_length is not None and max(len(c) for c in c_seqs) >= self.max_length:
            # the prompt cut below keeps >= 1 token: past this the position table overflows (an
            # IndexError in GPT-2's embedding); callers filter with fits(), this names the failure
            raise SequenceTooLong(f"a completion of {max(len(c) for c in c_seqs)} tokens; context {self.max_length}")
        p_seqs = [self._fit(self.encode_prompt(p), len(c)) for p, c in zip(prompts, c_seqs, strict=True)]
        starts = [i for i in range(len(p_seqs)) if i == 0 or p_seqs[i] != p_seqs[i - 1]]
        if self.share_prefill and len(starts) < len(p_seqs) and not self._checkpointing():
            logits, c_ids, c_mask = self._shared_prefill_logits(p_seqs, c_seqs, starts)
        else:
            logits, c_ids, c_mask = self._joint_logits(p_seqs, c_seqs)
        logp = torch.log_softmax(logits, dim=-1).gather(-1, c_ids[..., None]).squeeze(-1)
        fmask = c_mask.to(logp.dtype)
        return logp * fmask, fmask

    def _checkpointing(self) -> bool:
        """Whether the model recomputes activations in its backward pass (it then refuses a KV cache)."""
        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):  # transformers 5 renames it
            if hasattr(base, name):
                return bool(getattr(base, name))
        return False

    def _joint_logits(self, p_seqs: list[list[int]], c_seqs: list[list[int]]) -> tuple[Tensor, Tensor, Tensor]:
        """Each row's prompt and completion in one pass: the logits that predict each completion token."""
        p_ids, p_mask = self._pad(p_seqs, left=True)
        c_ids, c_mask = self._pad(c_seqs, left=False)
        ids, mask = torch.cat([p_ids, c_ids], dim=1), torch.cat([p_mask, c_mask], dim=1)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        width = c_ids.shape[1]
        self.meter.scored += int(mask.sum())
        with self.autocast():
            res = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=width + 1)
        return res.logits[:, :-1, :].float(), c_ids, c_mask  # column j predicts completion token j

    def _shared_prefill_logits(
        self, p_seqs: list[list[int]], c_seqs: list[list[int]], starts: list[int]
    ) -> tuple[Tensor, Tensor, Tensor]:
        """As :meth:`_joint_logits`, with each run of rows that share a prompt passing that prompt once.

        The prompt's KV cache (with its graph: gradients reach the prompt's positions from every row) is
        indexed out to the rows, whose completions then pass against it. A group's G completions of one
        prompt cost one prompt pass instead of G.
        """
        runs = torch.zeros(len(p_seqs), dtype=torch.long)
        runs[starts[1:]] = 1
        index = runs.cumsum(0).to(self.device)  # each row's run: the prompt it shares
        p_ids, p_mask = self._pad([p_seqs[s] for s in starts], left=True)
        c_ids, c_mask = self._pad(c_seqs, left=False)
        p_pos = (p_mask.cumsum(-1) - 1).clamp(min=0)
        self.meter.scored += int(p_mask.sum() + c_mask.sum())
        with self.autocast():
            res = self.model(
                input_ids=p_ids, attention_mask=p_mask, position_ids=p_pos, use_cache=True, logits_to_keep=1
            )
            first = res.logits[:, -1:, :].float()[index]  # predicts completion token 0
            if c_ids.shape[1] == 1:
                return first, c_ids, c_mask
            past = res.past_key_values
            past.batch_select_indices(index)
            rest = c_ids.shape[1] - 1  # tokens 0 .. T-2 predict tokens 1 .. T-1
            mask = torch.cat([p_mask[index], c_mask[:, :rest]], dim=1)
            positions = p_pos[index][:, -1:] + 1 + torch.arange(rest, device=self.device)
            out = self.model(
                input_ids=c_ids[:, :rest],
                attention_mask=mask,
                position_ids=positions,
                past_key_values=past,
                use_cache=True,
            )
        return torch.cat([first, out.logits.float()], dim=1), c_ids, c_mask

    @torch.no_grad()
    def sequence_logprobs(self, prompts: list[str], completions: list[str], batch_rows: int = 64) -> list[float]:
        """Each completion's log-probability (its tokens and eos) given its prompt, without grad.

        What a publisher claims in ``RolloutGroup.logprobs``: scored on the text as
        :meth:`token_logprobs` scores it, so a receiver computes the same quantity with its own policy.
        """
        out: list[float] = []
        for i in range(0, len(prompts), batch_rows):
            logp, _ = self.token_logprobs(prompts[i : i + batch_rows], completions[i : i + batch_rows])
            out += [float(x) for x in logp.sum(-1).tolist()]
        return out
