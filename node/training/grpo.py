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

import contextlib
import copy
import dataclasses
import logging
import math
import statistics
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from node.tasks.reasons import RejectReason
from node.tasks.verify import TrainGroup
from node.training.configs import LOSS_TYPES as LOSS_TYPES
from node.training.configs import GRPOConfig as GRPOConfig
from node.training.diagnostics import StepDiagnostics, flat_grad, source_key
from node.training.offpolicy import (
    FamilyBaseline,
    OffPolicyConfig,
    OwnLikelihood,
    completion_weight,
    receiver_advantages,
    share_limit,
)
from node.training.policy import Policy
from node.training.schedule import scheduled_lr
from node.training.share import PROBE, PartGradients, ShareSample, set_flat_grad, share_sample

logger = logging.getLogger(__name__)


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


def bounded_mass(advantages: Sequence[float], most: float = 1.0) -> list[float]:
    """``advantages`` scaled down, if need be, so that their mean absolute value is at most ``most``.

    >>> bounded_mass([2.0, 2.0])
    [1.0, 1.0]
    >>> bounded_mass([0.5, -0.5])
    [0.5, -0.5]
    """
    mass = sum(abs(a) for a in advantages) / max(len(advantages), 1)
    return list(advantages) if mass <= most else [a * most / mass for a in advantages]


PART_ORDER = {"a": 0, "b": 1, "e": 2, PROBE: 3}
"""The order of the share measure's parts in a step (:meth:`GRPOTrainer._chunks`)."""

INFORMATIVE = 1e-6
"""An advantage of at most this size moves nothing: its row is not informative."""


def cap_publisher_share(rows: Sequence[Row], share: float) -> tuple[list[Row], int]:
    """``rows`` with no publisher above ``share`` of the informative rows, nor of the advantage mass.

    The node's own rows (unit ``local``) count in the whole and are never cut. A publisher past the row
    limit (:func:`~node.training.offpolicy.share_limit`) keeps its first informative rows up to it (the rest
    are dropped); then one past the mass limit has its advantages scaled down to it. Returns the rows and how
    many were dropped or scaled down.

    >>> own = [Row("p", "c", 1.0)] * 2
    >>> peer = [Row("p", "c", 1.0, True, unit="x")] * 6
    >>> kept, cut = cap_publisher_share(own + peer, 0.5)
    >>> sum(r.unit == "x" for r in kept), cut  # 0.5 * (2 + L) = L
    (2, 4)
    """
    if share >= 1:
        return list(rows), 0
    count: Counter[str] = Counter(r.unit for r in rows if abs(r.advantage) > INFORMATIVE)
    peers = {u: n for u, n in count.items() if u != "local"}
    most = share_limit(float(count["local"]), [float(n) for n in peers.values()], share)
    seen: Counter[str] = Counter()
    kept: list[Row] = []
    for r in rows:
        if r.unit != "local" and peers.get(r.unit, 0) > most:
            if seen[r.unit] >= int(most + 1e-9):
                continue
            seen[r.unit] += abs(r.advantage) > INFORMATIVE
        kept.append(r)
    cut = len(rows) - len(kept)
    mass: dict[str, float] = {}
    for r in kept:
        mass[r.unit] = mass.get(r.unit, 0.0) + abs(r.advantage)
    by_peer = {u: m for u, m in mass.items() if u != "local" and m > 0}
    heaviest = share_limit(mass.get("local", 0.0), list(by_peer.values()), share)
    scale = {u: heaviest / m for u, m in by_peer.items() if m > heaviest}
    if not scale:
        return kept, cut
    cut += sum(1 for r in kept if r.unit in scale and abs(r.advantage) > INFORMATIVE)
    return [dataclasses.replace(r, advantage=r.advantage * scale[r.unit]) if r.unit in scale else r for r in kept], cut


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
    weights: Tensor | None = None,
) -> Tensor:
    """The clipped GRPO loss of [B, T] token log-probs, advantages [B] and mask [B, T].

    ``norm`` gives whole-step normalisers when this batch is one micro-batch
    of a larger step (the per-micro-batch losses then sum to the step's loss).
    ``weights`` [B] scales each completion's token losses (off-policy weights of
    external completions, :mod:`node.training.offpolicy`); normalisers are not
    re-weighted, so a down-weighted completion moves the update less.
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
    if weights is not None:
        per_token = per_token * weights[:, None].to(per_token.dtype)
    if cfg.loss_type == "grpo":
        per_seq = per_token.sum(-1) / mask.sum(-1).clamp(min=1)
        return per_seq.sum() / norm.n_seqs
    if cfg.loss_type == "bnpo":
        return per_token.sum() / max(norm.n_tokens, 1)
    return per_token.sum() / (norm.n_seqs * norm.max_len)


@dataclass(frozen=True)
class Row:
    """One completion to train on: its prompt, advantage and where it came from."""

    prompt: str
    completion: str
    advantage: float
    external: bool = False
    claimed_logp: float | None = None  # the publisher's sequence log-prob (external rows)
    source: str = "local"  # diagnostics key: "local" or "ext:<model>"
    unit: str = "local"  # gradient unit: "local" or the publisher's peer id
    part: str = ""  # the share measure's part (node.training.share): a, b (own halves), e (peers'), probe


def share_parts(own_and_peers: Sequence[TrainGroup], probing: Sequence[TrainGroup]) -> dict[int, str]:
    """Each group's share-measure part by id: own groups alternately ``a`` and ``b``, peers' ``e``, probe's
    :data:`~node.training.share.PROBE`."""
    own = [g for g in own_and_peers if not g.external]
    parts = {id(g): "ab"[i % 2] for i, g in enumerate(own)}
    parts |= {id(g): "e" for g in own_and_peers if g.external}
    return parts | {id(g): PROBE for g in probing}


def measured_share(parts: PartGradients, labels: dict[int, str]) -> ShareSample | None:
    """One step's :class:`~node.training.share.ShareSample` from its parts' gradients and group counts."""
    counts = Counter(labels.values())
    like = next(iter(parts.grads.values()))
    peer = "e" if counts["e"] else PROBE
    return share_sample(
        parts.part("a", like), parts.part("b", like), parts.part(peer, like), counts["a"], counts["b"], counts[peer]
    )


class GRPOTrainer:
    """Applies GRPO updates to a policy from train groups (local rewards only).

    External groups are handled as ``offpolicy`` says (:mod:`node.training.offpolicy`); with
    ``diagnose`` each step also reports, per source, the policy's log-probabilities of what it
    trained on, the completions' weights and advantage mass, the gradient norms of the local
    and external parts, and (``alignment``) each publisher's gradient cosine with the local part
    (a copy of the gradient per publisher trained on).
    """

    def __init__(
        self,
        policy: Policy,
        cfg: GRPOConfig | None = None,
        offpolicy: OffPolicyConfig | None = None,
        diagnose: bool = False,
    ) -> None:
        self.policy = policy
        self.cfg = cfg or GRPOConfig()
        self.offpolicy = offpolicy or OffPolicyConfig()
        self.diagnose = diagnose
        self.measure_share = self.offpolicy.adaptive_share
        self.baseline = FamilyBaseline(self.offpolicy.baseline_momentum)
        self.own_logp = OwnLikelihood()
        self._warned_share = False
        params = [p for p in policy.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params,
            lr=self.cfg.learning_rate,
            betas=(self.cfg.adam_beta1, self.cfg.adam_beta2),
            eps=self.cfg.adam_epsilon,
            weight_decay=self.cfg.weight_decay,
        )
        if self.cfg.gradient_checkpointing:
            enable = getattr(policy.model, "gradient_checkpointing_enable", None)
            if enable is None:
                raise ValueError(f"gradient checkpointing: model {policy.model_id} does not support it; drop the flag")
            # non-reentrant: gradients reach adapters even though the frozen inputs need none
            enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self._ref: Policy | None = None
        if self.cfg.beta > 0:
            ref_model = copy.deepcopy(policy.model).requires_grad_(False)
            self._ref = Policy(ref_model, policy.tokenizer, policy.model_id, str(policy.device))

    def advantages(self, group: TrainGroup) -> list[float]:
        """The group's advantages: group-normalised, or against this node's expected reward (external, receiver).

        An external group's mean absolute advantage is at most 1, what a group-normalised group of this
        node's own can reach (its mean absolute deviation is at most its std): a peer's group moves the
        policy no more per completion than one of its own, whatever the baseline makes of it.
        """
        base = self.baseline.get(group.task_family)
        if group.external and self.offpolicy.baseline == "receiver" and base is not None:
            adv = bounded_mass(receiver_advantages(group.rewards, base, self.offpolicy.min_scale))
        else:
            adv = group_advantages(group.rewards, self.cfg.scale_rewards)
        if group.external and self.offpolicy.successes_only:
            return [max(0.0, a) for a in adv]  # only a peer's successes guide (OffPolicyConfig.successes_only)
        return adv

    def has_signal(self, group: TrainGroup) -> bool:
        """Whether any of the group's advantages is non-zero (only then does it move the policy)."""
        return any(abs(a) > 1e-6 for a in self.advantages(group))

    def _rows(self, groups: Sequence[TrainGroup], parts: dict[int, str] | None = None) -> list[Row]:
        """The groups' rows; ``parts`` labels each group's rows for the share measure (by the group's id)."""
        rows: list[Row] = []
        for g in groups:
            claims = g.behaviour_logprobs or (None,) * len(g.completions)
            key = source_key(g)
            part = (parts or {}).get(id(g), "")
            for c, a, lp in zip(g.completions, self.advantages(g), claims, strict=True):
                unit = g.source_peer if g.external else "local"
                rows.append(Row(g.prompt, c, a, g.external, lp if g.external else None, key, unit, part))
        return rows

    def _token_logps(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        """Each completion's mean token log-probability under the policy now (no grad; eos included)."""
        if not completions:
            return []
        seq = self.policy.sequence_logprobs(list(prompts), list(completions), self.cfg.micro_batch_size)
        return [s / len(self.policy.encode_completion(c)) for s, c in zip(seq, completions, strict=True)]

    def _observe_own(self, local: Sequence[TrainGroup]) -> None:
        """Fold this node's own completions' mean token log-probabilities into the gate's reference.

        Every own group counts, with signal or not: the reference is what this node writes, not what it
        trains on. A group's behaviour log-probabilities, when the node scored them for sharing, are those
        of this same policy (before this step), so they are reused rather than scored again.
        """
        if self.offpolicy.max_logp_gap <= 0 or not local:
            return
        known: list[float] = []
        prompts: list[str] = []
        texts: list[str] = []
        for g in local:
            if g.behaviour_logprobs is not None:
                known += [
                    s / len(self.policy.encode_completion(c))
                    for s, c in zip(g.behaviour_logprobs, g.completions, strict=True)
                ]
            else:
                prompts += [g.prompt] * len(g.completions)
                texts += list(g.completions)
        self.own_logp.add(known + self._token_logps(prompts, texts))

    def _plausible(self, rows: Sequence[Row]) -> tuple[list[Row], int]:
        """``rows`` without the peers' completions this policy finds implausible (``max_logp_gap``); how many."""
        floor = self.own_logp.floor(self.offpolicy.max_logp_gap)
        external = [r for r in rows if r.external]
        if floor is None or not external:
            return list(rows), 0
        scores = self._token_logps([r.prompt for r in external], [r.completion for r in external])
        refused = {id(r) for r, s in zip(external, scores, strict=True) if s < floor}
        kept = [r for r in rows if id(r) not in refused]
        if refused:
            logger.info("gave weight 0 to %d peer completion(s) below %.2f nats/token", len(refused), floor)
        return kept, len(rows) - len(kept)

    def _defend(self, rows: Sequence[Row]) -> tuple[list[Row], Counter[str]]:
        """The plausibility gate, then the publisher share cap (on the rows left: the informative ones);
        the completions each cut, by reason."""
        cut: Counter[str] = Counter()
        kept, cut[RejectReason.IMPLAUSIBLE.value] = self._plausible(rows)
        kept, cut[RejectReason.SHARE_CAP.value] = cap_publisher_share(kept, self.offpolicy.max_publisher_share)
        return kept, +cut

    def _norm(self, rows: Sequence[Row]) -> LossNorm:
        lengths = [len(self.policy.encode_completion(r.completion)) for r in rows]
        return LossNorm(len(rows), sum(lengths), max(lengths))

    @torch.no_grad()
    def _fixed_logprobs(self, policy: Policy, chunks: Sequence[Sequence[Row]]) -> list[Tensor]:
        return [policy.token_logprobs([r.prompt for r in ch], [r.completion for r in ch])[0] for ch in chunks]

    def _weights(self, chunk: Sequence[Row], logp: Tensor, mask: Tensor) -> Tensor | None:
        """Per-completion off-policy weights of a chunk (from log-probs before this step), None if all 1."""
        if not self.offpolicy.weighted or not any(r.external for r in chunk):
            return None
        seq = logp.detach().sum(-1).tolist()
        tokens = mask.sum(-1).tolist()
        w = [
            completion_weight(s, int(n), r.claimed_logp, self.offpolicy) if r.external else 1.0
            for r, s, n in zip(chunk, seq, tokens, strict=True)
        ]
        return torch.tensor(w, dtype=logp.dtype, device=logp.device)

    def _update(
        self,
        chunks: Sequence[Sequence[Row]],
        norm: LossNorm,
        old: list[Tensor] | None,
        ref: list[Tensor] | None,
        diag: StepDiagnostics | None = None,
        parts: PartGradients | None = None,
    ) -> tuple[float, int, float]:
        """One optimiser step over all chunks; returns (loss, clipped tokens, grad norm).

        With ``parts`` each part's gradient is recorded (:class:`~node.training.share.PartGradients`), and the
        :data:`~node.training.share.PROBE` part's, scored last, is taken back out before the step.
        """
        with self._gradient_passes():
            return self._update_inner(chunks, norm, old, ref, diag, parts)

    @contextlib.contextmanager
    def _gradient_passes(self) -> Iterator[None]:
        """Train mode for the passes that build gradients, when checkpointing (transformers recomputes
        layers only in train mode); the node otherwise keeps its model in eval mode."""
        if not self.cfg.gradient_checkpointing:
            yield
            return
        self.policy.model.train()
        try:
            yield
        finally:
            self.policy.model.eval()

    def _update_inner(
        self,
        chunks: Sequence[Sequence[Row]],
        norm: LossNorm,
        old: list[Tensor] | None,
        ref: list[Tensor] | None,
        diag: StepDiagnostics | None,
        parts: PartGradients | None,
    ) -> tuple[float, int, float]:
        self.optimizer.zero_grad(set_to_none=True)
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        total, n_clipped = 0.0, 0
        unit = None
        for k, chunk in enumerate(chunks):
            if chunk[0].part == PROBE and diag is not None:  # the diagnostics describe what the step applies
                diag.finish_grads(flat_grad(params))
                diag = None
            if parts is not None and chunk[0].part != parts.current:  # a snapshot per part, not per chunk
                parts.enter(chunk[0].part, flat_grad(params))
            if diag is not None and chunk[0].unit != unit:  # chunks come unit by unit: local, then each publisher
                unit = chunk[0].unit
                diag.boundary(flat_grad(params), unit)
            logp, mask = self.policy.token_logprobs([r.prompt for r in chunk], [r.completion for r in chunk])
            old_logp = old[k] if old is not None else logp.detach()
            adv = torch.tensor([r.advantage for r in chunk], dtype=logp.dtype, device=logp.device)
            weights = self._weights(chunk, old_logp, mask)
            loss = grpo_loss(logp, old_logp, adv, mask, self.cfg, ref[k] if ref else None, norm, weights)
            loss.backward()
            if chunk[0].part == PROBE:
                continue  # measured, not applied: neither its loss nor its clipping is the step's
            total += float(loss.item())
            ratio = torch.exp(logp.detach() - old_logp)
            n_clipped += int((_clipped(ratio, adv[:, None], self.cfg) & (mask > 0)).sum().item())
            if diag is not None:
                diag.add(chunk, old_logp, mask, weights)
        if diag is not None:
            diag.finish_grads(flat_grad(params))
        if parts is not None:
            parts.close(flat_grad(params))
            if parts.before_probe is not None:
                set_flat_grad(params, parts.before_probe)
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

    def _chunks(self, rows: Sequence[Row], by_unit: bool) -> list[list[Row]]:
        """Micro-batches; ``by_unit``: local rows first, then one publisher at a time (so each part's gradient
        can be told apart, at the cost of smaller batches). Rows of different share parts (:attr:`Row.part`)
        never share a micro-batch, and each part's come together: own halves, peers', probe."""
        mb = self.cfg.micro_batch_size
        units: dict[str, list[Row]] = {}
        for r in sorted(rows, key=lambda r: (PART_ORDER.get(r.part, 0), r.external)):
            units.setdefault(f"{r.part}:{r.unit if by_unit else 'all'}", []).append(r)
        chunks: list[list[Row]] = []
        for part in units.values():
            chunks += [part[i : i + mb] for i in range(0, len(part), mb)]
        return chunks

    def _probe_rows(
        self, kept: Sequence[TrainGroup], probing: Sequence[TrainGroup], labels: dict[int, str] | None
    ) -> list[Row]:
        """The probe groups' rows after the defences they would meet beside this step's own rows (the cuts
        they would suffer are not counted: nothing of them is trained on)."""
        if not probing:
            return []
        rows, _ = self._defend(self._rows([g for g in kept if not g.external] + list(probing), labels))
        return [r for r in rows if r.part == PROBE]

    def lr_at(self, done: int) -> float:
        """The learning rate of the step after ``done`` rounds (:mod:`node.training.schedule`)."""
        cfg = self.cfg
        return scheduled_lr(cfg.learning_rate, cfg.lr_scheduler_type, cfg.lr_decay_rounds, cfg.min_lr_rate, done)

    def step(self, groups: Sequence[TrainGroup], done: int = 0, probe: Sequence[TrainGroup] = ()) -> dict[str, Any]:
        """Train on ``groups``: skip groups past the context, drop those without signal, then update.

        This node's own groups first update its per-family expected reward (the receiver baseline).
        Groups with a completion past the model's context are skipped and
        counted (``n_too_long``, see :meth:`within_context`); groups whose advantages are all zero
        (:meth:`has_signal`) are dropped and counted (``n_dropped``). Old log-probs
        are fixed before the first update (under no_grad; with
        ``num_iterations == 1`` they equal the detached current ones, so no
        extra forward pass is made). Peers' rows then pass the plausibility gate and the publisher share
        cap (:meth:`_defend`). Returns statistics: loss (last update),
        n_groups (kept), n_dropped, n_too_long, n_completions, grad_norm (last
        update), clip_frac (over all updates), mean_reward (all given groups), seconds, lr (the
        rate after ``done`` rounds of the schedule), ``cut`` (reason -> peers' completions the defences
        removed or scaled down), ``publisher_rows`` / ``publisher_adv`` (peer -> rows and sum of absolute
        advantages trained on), and with ``diagnose`` ``sources`` and the local /
        external gradient norms (first update).

        With ``adaptive_share`` (:mod:`node.training.share`) the first update also measures what one peer's
        group is worth here against one own group (``share``: a :class:`~node.training.share.ShareSample` or
        None); ``probe`` are peers' groups measured so, through the same defences, but not trained on.
        """
        t0 = time.perf_counter()
        lr = self.lr_at(done)
        for param_group in self.optimizer.param_groups:  # a restored optimizer state carries its own: replaced
            param_group["lr"] = lr
        for g in groups:
            if not g.external:
                self.baseline.update(g.task_family, g.rewards)
        fitting, too_long = self.within_context(groups)
        probing = [g for g in probe if all(self.policy.fits(c) for c in g.completions)] if self.measure_share else []
        labels = share_parts(fitting, probing) if self.measure_share else None
        kept = [g for g in fitting if self.has_signal(g)]
        all_rewards = [r for g in groups for r in g.rewards]
        stats: dict[str, Any] = {
            "loss": 0.0, "n_groups": len(kept), "n_dropped": len(fitting) - len(kept), "n_too_long": too_long,
            "n_completions": 0, "grad_norm": 0.0, "clip_frac": 0.0,
            "mean_reward": sum(all_rewards) / len(all_rewards) if all_rewards else 0.0, "lr": lr,
            "cut": {}, "publisher_rows": {}, "publisher_adv": {}, "share": None,
        }  # fmt: skip
        rows: list[Row] = []
        probed: list[Row] = []
        if kept:
            if any(g.external for g in kept) or probing:
                self._observe_own([g for g in fitting if not g.external])
            rows, cut = self._defend(self._rows(kept, labels))
            probed = self._probe_rows(kept, [g for g in probing if self.has_signal(g)], labels)
            stats["cut"] = dict(cut)
            # a group the defences cut whole (a lone peer's beside no own signal) is not trained on; with no
            # informative row left there is no step at all (counted so: the weights must not seem to move)
            left = {(r.unit, r.prompt) for r in rows if abs(r.advantage) > INFORMATIVE}
            if not left and cut.get(RejectReason.SHARE_CAP.value) and not self._warned_share:
                self._warned_share = True  # a node with one peer and no signal of its own learns nothing: say so
                logger.warning(
                    "a peer's groups were cut to --max-publisher-share %.2f beside no signal of this node's own, "
                    "so this step trains on nothing; with a single peer, raise --max-publisher-share (1: off)",
                    self.offpolicy.max_publisher_share,
                )
            rows = rows if left else []
            stats["n_groups"] = sum((g.source_peer if g.external else "local", g.prompt) in left for g in kept)
        for r in rows:
            if r.external:
                stats["publisher_rows"][r.unit] = stats["publisher_rows"].get(r.unit, 0) + 1
                stats["publisher_adv"][r.unit] = stats["publisher_adv"].get(r.unit, 0.0) + abs(r.advantage)
        if rows:
            chunks = self._chunks(rows + probed, by_unit=self.diagnose)
            applied = sum(ch[0].part != PROBE for ch in chunks)  # the probe's chunks come last
            norm = self._norm(rows)
            old = self._fixed_logprobs(self.policy, chunks) if self.cfg.num_iterations > 1 else None
            ref = self._fixed_logprobs(self._ref, chunks) if self._ref is not None else None
            diag = StepDiagnostics(kept) if self.diagnose else None
            parts = PartGradients() if labels is not None else None
            n_clipped = 0
            for i in range(self.cfg.num_iterations):
                first = i == 0  # later updates train on what the step applies, and measure nothing
                n = len(chunks) if first else applied
                loss, clipped, grad_norm = self._update(
                    chunks[:n], norm, old[:n] if old else None, ref[:n] if ref else None,
                    diag if first else None, parts if first else None,
                )  # fmt: skip
                n_clipped += clipped
            if parts is not None and labels is not None:
                stats["share"] = measured_share(parts, labels)
            stats.update(loss=loss, n_completions=len(rows), grad_norm=grad_norm)
            stats["clip_frac"] = n_clipped / (norm.n_tokens * self.cfg.num_iterations)
            if diag is not None:
                stats.update(diag.summary())
                stats["alignment"] = dict(diag.alignment)
        stats["seconds"] = time.perf_counter() - t0
        return stats
