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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from swarm.fingerprint import model_fingerprint

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationConfig:
    """How completions are sampled."""

    temperature: float = field(default=1.0, metadata={"help": "Softmax temperature; 0 means greedy decoding (argmax)."})
    top_p: float = field(
        default=1.0, metadata={"help": "Nucleus sampling: keep the smallest token set with this mass, in (0, 1]."}
    )
    max_new_tokens: int = field(
        default=1,  # the built-in tiny models answer in one token; see node.training.models.ModelDefaults
        metadata={"help": "Most tokens sampled per completion (eos included), >= 1."},
    )

    def __post_init__(self) -> None:
        if not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if isinstance(self.max_new_tokens, bool) or not 1 <= self.max_new_tokens <= 4096:
            raise ValueError(f"max_new_tokens must be in [1, 4096], got {self.max_new_tokens}")


class SequenceTooLong(ValueError):
    """A completion that leaves no room for its prompt in the model's context (positions)."""


def sample_next(logits: Tensor, cfg: GenerationConfig, generator: torch.Generator) -> Tensor:
    """Sample one token id per row of ``logits`` [B, V] with temperature and top-p."""
    if cfg.temperature == 0.0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / cfg.temperature, dim=-1)
    if cfg.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        before = sorted_p.cumsum(dim=-1) - sorted_p  # mass strictly before each token
        sorted_p = sorted_p.masked_fill(before >= cfg.top_p, 0.0)  # always keeps the top token
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    probs = probs.to(generator.device)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1).to(logits.device)


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
    @torch.no_grad()
    def _sample_rows(self, prompt_ids: list[list[int]], cfg: GenerationConfig, gen: torch.Generator) -> list[str]:
        ids, mask = self._pad(prompt_ids, left=True)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        rows = len(prompt_ids)
        out = torch.full((rows, cfg.max_new_tokens), self.pad_id, dtype=torch.long, device=self.device)
        done = torch.zeros(rows, dtype=torch.bool, device=self.device)
        past = None
        for step in range(cfg.max_new_tokens):
            if self.stop():  # leaving: a long generation must not outlast the leave bound
                break
            with self.autocast():
                res = self.model(
                    input_ids=ids, attention_mask=mask, position_ids=positions,
                    past_key_values=past, use_cache=True, logits_to_keep=1,
                )  # fmt: skip
            logits = res.logits[:, -1, :].float()
            logits[:, self._banned] = float("-inf")
            logits[:, self.vocab_size :] = float("-inf")
            nxt = sample_next(logits, cfg, gen).masked_fill(done, self.pad_id)
            out[:, step] = nxt
            done |= nxt == self.eos_id
            if bool(done.all()):
                break
            past, ids = res.past_key_values, nxt[:, None]
            mask = torch.cat([mask, torch.ones((rows, 1), dtype=mask.dtype, device=self.device)], dim=1)
            positions = positions[:, -1:] + 1
        texts = []
        for row in out.tolist():
            cut = row.index(self.eos_id) if self.eos_id in row else len(row)
            texts.append(self.tokenizer.decode(row[:cut], skip_special_tokens=True))
        return texts

    def generate(
        self, prompts: list[str], n: int, cfg: GenerationConfig, seed: int | torch.Generator | None = None
    ) -> list[list[str]]:
        """Sample ``n`` completions for each prompt; returns one list of ``n`` texts per prompt.

        Rows are batched with left padding; sampling stops at eos or after
        ``cfg.max_new_tokens`` tokens; texts exclude eos and special tokens.
        ``seed`` is an int or a ``torch.Generator`` (advanced by the call): the
        same seed, model and prompts give the same completions.
        """
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if isinstance(seed, torch.Generator):
            gen = seed
        else:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(0 if seed is None else int(seed))
        encoded = [self._fit(self.encode_prompt(p), cfg.max_new_tokens) for p in prompts]
        rows = [ids for ids in encoded for _ in range(n)]
        texts: list[str] = []
        for start in range(0, len(rows), self.max_batch_rows):
            texts.extend(self._sample_rows(rows[start : start + self.max_batch_rows], cfg, gen))
        return [texts[i * n : (i + 1) * n] for i in range(len(prompts))]

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
        p_ids, p_mask = self._pad(p_seqs, left=True)
        c_ids, c_mask = self._pad(c_seqs, left=False)
        ids, mask = torch.cat([p_ids, c_ids], dim=1), torch.cat([p_mask, c_mask], dim=1)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        width = c_ids.shape[1]
        with self.autocast():
            res = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=width + 1)
        logits = res.logits[:, :-1, :].float()  # column j predicts completion token j
        logp = torch.log_softmax(logits, dim=-1).gather(-1, c_ids[..., None]).squeeze(-1)
        fmask = c_mask.to(logp.dtype)
        return logp * fmask, fmask

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
