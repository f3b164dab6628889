"""GRPO on text groups: group-normalised advantages and the clipped surrogate loss.

Field names follow TRL's ``GRPOConfig`` where one exists. The loss per token is
``-min(r * A, clip(r, 1 - epsilon, 1 + epsilon_high) * A) + beta * KL`` with
``r = exp(logp - old_logp)`` and the k3 KL estimator against the initial
weights (no reference model is kept when ``beta == 0``). ``loss_type`` picks
how token losses are averaged:

- ``"grpo"``: mean over each completion's tokens, then mean over completions
  (the original GRPO; favours short completions' tokens);
- ``"bnpo"`` (default): sum over all tokens / number of completion tokens in
  the batch (TRL's ``"dapo"``/``"bnpo"`` on one process; no length bias per token);
- ``"dr_grpo"``: sum over all tokens / (completions x longest completion in the
  batch) (Dr. GRPO; TRL divides by the configured ``max_completion_length``).

Normalisers are computed over the whole step, so micro-batching does not
change the loss or the gradient.
"""

from __future__ import annotations

import copy
import logging
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import Tensor

from node.tasks.verify import TrainGroup
from node.training.policy import Policy

logger = logging.getLogger(__name__)

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo")


@dataclass(frozen=True)
class GRPOConfig:
    """Hyper-parameters of the GRPO inner optimiser (TRL names where they exist)."""

    learning_rate: float = field(
        default=1e-3, metadata={"help": "AdamW learning rate (1e-3 suits the tiny built-in models)."}
    )
    beta: float = field(default=0.0, metadata={"help": "KL coefficient against the initial weights; 0 disables."})
    epsilon: float = field(default=0.2, metadata={"help": "Lower clip range: ratio >= 1 - epsilon."})
    epsilon_high: float = field(default=0.28, metadata={"help": "Upper clip range: ratio <= 1 + epsilon_high."})
    num_iterations: int = field(default=1, metadata={"help": "Optimiser updates per batch of groups (mu)."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient norm clip; 0 disables clipping."})
    scale_rewards: bool = field(default=True, metadata={"help": "Divide advantages by the group's std."})
    loss_type: str = field(default="bnpo", metadata={"help": "Token averaging: grpo, bnpo or dr_grpo."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW beta1."})
    adam_beta2: float = field(default=0.999, metadata={"help": "AdamW beta2."})
    adam_epsilon: float = field(default=1e-8, metadata={"help": "AdamW epsilon."})
    micro_batch_size: int = field(default=64, metadata={"help": "Completions per forward/backward pass."})

    def __post_init__(self) -> None:
        checks = [
            (0 < self.learning_rate < 1, "learning_rate must be in (0, 1)"),
            (self.beta >= 0, "beta must be >= 0"),
            (0 <= self.epsilon < 1, "epsilon must be in [0, 1)"),
            (self.epsilon_high >= 0, "epsilon_high must be >= 0"),
            (1 <= self.num_iterations <= 64, "num_iterations must be in [1, 64]"),
            (self.max_grad_norm >= 0, "max_grad_norm must be >= 0"),
            (self.loss_type in LOSS_TYPES, f"loss_type must be one of {LOSS_TYPES}"),
            (self.weight_decay >= 0, "weight_decay must be >= 0"),
            (0 <= self.adam_beta1 < 1 and 0 <= self.adam_beta2 < 1, "adam betas must be in [0, 1)"),
            (self.adam_epsilon > 0, "adam_epsilon must be > 0"),
            (self.micro_batch_size >= 1, "micro_batch_size must be >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"GRPOConfig: {message}")

    @classmethod
    def help(cls) -> dict[str, str]:
        """Field name -> help text."""
        return {f.name: str(f.metadata.get("help", "")) for f in fields(cls)}


def group_advantages(rewards: Sequence[float], scale: bool = True) -> list[float]:
    """Rewards minus the group mean, divided by (sample std + 1e-4) if ``scale``.

    >>> [round(a, 3) for a in group_advantages([1.0, 0.0])]
    [0.707, -0.707]
    """
    mean = sum(rewards) / len(rewards)
    centred = [r - mean for r in rewards]
    if not scale:
        return centred
    std = statistics.stdev(rewards) if len(rewards) > 1 else 0.0
    return [c / (std + 1e-4) for c in centred]


def drop_zero_advantage(groups: Sequence[TrainGroup]) -> tuple[list[TrainGroup], int]:
    """Keep the groups whose rewards are not all equal; they alone carry a GRPO signal."""
    kept = [g for g in groups if max(g.rewards) - min(g.rewards) > 1e-9]
    return kept, len(groups) - len(kept)


@dataclass(frozen=True)
class LossNorm:
    """Whole-step normalisers: completions, completion tokens, longest completion (tokens)."""

    n_seqs: int
    n_tokens: int
    max_len: int

    @classmethod
    def of(cls, mask: Tensor) -> LossNorm:
        """The normalisers of a single batch."""
        return cls(mask.shape[0], int(mask.sum().item()), mask.shape[1])


def _clipped(ratio: Tensor, adv: Tensor, cfg: GRPOConfig) -> Tensor:
    """Tokens where the clipped term is active (its gradient is zero)."""
    return ((ratio < 1 - cfg.epsilon) & (adv < 0)) | ((ratio > 1 + cfg.epsilon_high) & (adv > 0))


def grpo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: GRPOConfig,
    ref_logp: Tensor | None = None,
    norm: LossNorm | None = None,
) -> Tensor:
    """The clipped GRPO loss of [B, T] token log-probs, advantages [B] and mask [B, T].

    ``norm`` gives whole-step normalisers when this batch is one micro-batch
    of a larger step (the per-micro-batch losses then sum to the step's loss).
    """
    norm = norm or LossNorm.of(mask)
    ratio = torch.exp(logp - old_logp)
    adv = advantages[:, None].to(logp.dtype)
    clipped_ratio = ratio.clamp(1 - cfg.epsilon, 1 + cfg.epsilon_high)
    per_token = -torch.min(ratio * adv, clipped_ratio * adv)
    if cfg.beta > 0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs reference log-probs")
        delta = ref_logp - logp
        per_token = per_token + cfg.beta * (torch.exp(delta) - delta - 1)
    per_token = per_token * mask
    if cfg.loss_type == "grpo":
        per_seq = per_token.sum(-1) / mask.sum(-1).clamp(min=1)
        return per_seq.sum() / norm.n_seqs
    if cfg.loss_type == "bnpo":
        return per_token.sum() / max(norm.n_tokens, 1)
    return per_token.sum() / (norm.n_seqs * norm.max_len)


Row = tuple[str, str, float]  # prompt, completion, advantage


class GRPOTrainer:
    """Applies GRPO updates to a policy from train groups (local rewards only)."""

    def __init__(self, policy: Policy, cfg: GRPOConfig | None = None) -> None:
        self.policy = policy
        self.cfg = cfg or GRPOConfig()
        params = [p for p in policy.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params,
            lr=self.cfg.learning_rate,
            betas=(self.cfg.adam_beta1, self.cfg.adam_beta2),
            eps=self.cfg.adam_epsilon,
            weight_decay=self.cfg.weight_decay,
        )
        self._ref: Policy | None = None
        if self.cfg.beta > 0:
            ref_model = copy.deepcopy(policy.model).requires_grad_(False)
            self._ref = Policy(ref_model, policy.tokenizer, policy.model_id, str(policy.device))

    def _rows(self, groups: Sequence[TrainGroup]) -> list[Row]:
        rows: list[Row] = []
        for g in groups:
            advs = group_advantages(g.rewards, self.cfg.scale_rewards)
            rows.extend((g.prompt, c, a) for c, a in zip(g.completions, advs, strict=True))
        return rows

    def _norm(self, rows: Sequence[Row]) -> LossNorm:
        lengths = [len(self.policy.encode_completion(c)) for _, c, _ in rows]
        return LossNorm(len(rows), sum(lengths), max(lengths))

    @torch.no_grad()
    def _fixed_logprobs(self, policy: Policy, chunks: Sequence[Sequence[Row]]) -> list[Tensor]:
        return [policy.token_logprobs([r[0] for r in ch], [r[1] for r in ch])[0] for ch in chunks]

    def _update(
        self, chunks: Sequence[Sequence[Row]], norm: LossNorm, old: list[Tensor] | None, ref: list[Tensor] | None
    ) -> tuple[float, int, float]:
        """One optimiser step over all chunks; returns (loss, clipped tokens, grad norm)."""
        self.optimizer.zero_grad(set_to_none=True)
        total, n_clipped = 0.0, 0
        for k, chunk in enumerate(chunks):
            logp, mask = self.policy.token_logprobs([r[0] for r in chunk], [r[1] for r in chunk])
            old_logp = old[k] if old is not None else logp.detach()
            adv = torch.tensor([r[2] for r in chunk], dtype=logp.dtype, device=logp.device)
            loss = grpo_loss(logp, old_logp, adv, mask, self.cfg, ref[k] if ref else None, norm)
            loss.backward()
            total += float(loss.item())
            ratio = torch.exp(logp.detach() - old_logp)
            n_clipped += int((_clipped(ratio, adv[:, None], self.cfg) & (mask > 0)).sum().item())
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        limit = self.cfg.max_grad_norm if self.cfg.max_grad_norm > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, limit).item())
        self.optimizer.step()
        # Free the gradients now rather than at the next step: for a real LM they are as large as
        # the weights (540 MB for SmolLM2-135M) and would otherwise sit through the next generation.
        self.optimizer.zero_grad(set_to_none=True)
        return total, n_clipped, grad_norm

    def within_context(self, groups: Sequence[TrainGroup]) -> tuple[list[TrainGroup], int]:
        """Keep the groups whose every completion fits the model's context; count the others.

        Defence in depth: the node's acceptance policy already refuses peers'
        groups that do not fit, but the trainer must never hand the model a
        sequence past its position table (an IndexError in GPT-2), whatever
        went wrong upstream. A whole group is skipped, not one completion, so
        the group-normalised advantages of what is trained stay those of the group.
        """
        kept = [g for g in groups if all(self.policy.fits(c) for c in g.completions)]
        skipped = len(groups) - len(kept)
        if skipped:
            logger.warning("skipped %d group(s) with a completion longer than the model's context", skipped)
        return kept, skipped

    def step(self, groups: Sequence[TrainGroup]) -> dict[str, Any]:
        """Train on ``groups``: skip groups past the context, drop zero-advantage groups, then update.

        Groups with a completion past the model's context are skipped and
        counted (``n_too_long``, see :meth:`within_context`). Old log-probs
        are fixed before the first update (under no_grad; with
        ``num_iterations == 1`` they equal the detached current ones, so no
        extra forward pass is made). Returns statistics: loss (last update),
        n_groups (kept), n_dropped, n_too_long, n_completions, grad_norm (last
        update), clip_frac (over all updates), mean_reward (all given groups), seconds.
        """
        t0 = time.perf_counter()
        fitting, too_long = self.within_context(groups)
        kept, dropped = drop_zero_advantage(fitting)
        all_rewards = [r for g in groups for r in g.rewards]
        stats: dict[str, Any] = {
            "loss": 0.0, "n_groups": len(kept), "n_dropped": dropped, "n_too_long": too_long, "n_completions": 0,
            "grad_norm": 0.0, "clip_frac": 0.0,
            "mean_reward": sum(all_rewards) / len(all_rewards) if all_rewards else 0.0,
        }  # fmt: skip
        if kept:
            rows = self._rows(kept)
            mb = self.cfg.micro_batch_size
            chunks = [rows[i : i + mb] for i in range(0, len(rows), mb)]
            norm = self._norm(rows)
            old = self._fixed_logprobs(self.policy, chunks) if self.cfg.num_iterations > 1 else None
            ref = self._fixed_logprobs(self._ref, chunks) if self._ref is not None else None
            n_clipped = 0
            for _ in range(self.cfg.num_iterations):
                loss, clipped, grad_norm = self._update(chunks, norm, old, ref)
                n_clipped += clipped
            stats.update(loss=loss, n_completions=len(rows), grad_norm=grad_norm)
            stats["clip_frac"] = n_clipped / (norm.n_tokens * self.cfg.num_iterations)
        stats["seconds"] = time.perf_counter() - t0
        return stats
