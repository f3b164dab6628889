"""What a training step learned from where: per-source log-probabilities, weights and gradient shares.

The value of a peer's group is the question behind sharing: a group that is informative (non-zero
advantage) may still teach the receiver little if the receiver would never produce its
completions. For each step, per source (``local`` or ``ext:<model>``), this records how likely the
receiver found the completions it trained on (mean token and sequence log-probability, before the
update), their mean off-policy weight and their share of the advantage mass, and for the step as a
whole the gradient norms of the local and the external parts and the cosine between them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor


class RowLike(Protocol):
    @property
    def advantage(self) -> float: ...
    @property
    def source(self) -> str: ...
    @property
    def external(self) -> bool: ...


class GroupLike(Protocol):
    @property
    def external(self) -> bool: ...
    @property
    def source_model(self) -> str: ...


LOCAL = "local"


def source_key(group: GroupLike) -> str:
    """The diagnostics key of a group's source: ``local`` or ``ext:<model>`` (the peer's claimed model)."""
    return f"ext:{group.source_model or 'unknown'}" if group.external else "local"


def flat_grad(params: Sequence[Tensor]) -> Tensor:
    """All parameters' gradients as one float32 vector (zeros where a gradient is missing)."""
    parts = [(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).float() for p in params]
    return torch.cat(parts) if parts else torch.zeros(0)


@dataclass
class _Source:
    groups: int = 0
    completions: int = 0
    token_logp: float = 0.0  # sums, averaged in summary()
    seq_logp: float = 0.0
    weight: float = 0.0
    adv_mass: float = 0.0


@dataclass
class StepDiagnostics:
    """Accumulates one update's per-source numbers; :meth:`summary` gives the step's ``stats`` entries.

    The trainer calls :meth:`boundary` with the running gradient before each new *unit* of chunks
    (``local`` first, then one unit per publisher) and once at the end, so each unit's own gradient
    is the difference of two snapshots; ``alignment`` is then each publisher's cosine with the local part.
    """

    groups: Sequence[GroupLike]
    local_grad: Tensor | None = None
    alignment: dict[str, float] = field(default_factory=dict)
    _unit: str | None = None
    _prev: Tensor | None = None
    _sources: dict[str, _Source] = field(default_factory=lambda: defaultdict(_Source))
    _grads: dict[str, float] = field(default_factory=dict)

    def boundary(self, running: Tensor, next_unit: str | None) -> None:
        """The running gradient where the chunks of ``self._unit`` end and those of ``next_unit`` begin."""
        if self._unit is not None and self._prev is not None:
            part = running - self._prev
            if self._unit == LOCAL:
                self.local_grad = part
            elif self.local_grad is not None:
                ln, pn = float(self.local_grad.norm()), float(part.norm())
                if ln > 0 and pn > 0:
                    self.alignment[self._unit] = float(torch.dot(self.local_grad, part)) / (ln * pn)
        self._unit, self._prev = next_unit, running

    def add(self, chunk: Sequence[RowLike], logp: Tensor, mask: Tensor, weights: Tensor | None) -> None:
        """One micro-batch: its rows, their token log-probs before the update, mask and weights."""
        seq = logp.detach().sum(-1).tolist()
        tokens = mask.sum(-1).tolist()
        w = weights.tolist() if weights is not None else [1.0] * len(chunk)
        for row, s, n, wi in zip(chunk, seq, tokens, w, strict=True):
            src = self._sources[row.source]
            src.completions += 1
            src.seq_logp += s
            src.token_logp += s / max(n, 1.0)
            src.weight += wi
            src.adv_mass += abs(row.advantage) * wi

    def finish_grads(self, total: Tensor) -> None:
        """The whole step's gradient: split into the local part and the external rest."""
        self.boundary(total, None)
        local = self.local_grad if self.local_grad is not None else torch.zeros_like(total)
        external = total - local
        ln, en = float(local.norm()), float(external.norm())
        cos = float(torch.dot(local, external)) / (ln * en) if ln > 0 and en > 0 else None
        self._grads = {"grad_local": ln, "grad_external": en}
        if cos is not None and math.isfinite(cos):
            self._grads["grad_cos"] = cos

    def summary(self) -> dict[str, Any]:
        """``sources``: per source groups, completions, mean token/seq log-prob, mean weight, advantage share."""
        for g in self.groups:
            self._sources[source_key(g)].groups += 1
        mass = sum(s.adv_mass for s in self._sources.values()) or 1.0
        sources = {
            key: {
                "groups": s.groups,
                "completions": s.completions,
                "token_logp": round(s.token_logp / max(s.completions, 1), 4),
                "seq_logp": round(s.seq_logp / max(s.completions, 1), 4),
                "weight": round(s.weight / max(s.completions, 1), 4),
                "adv_share": round(s.adv_mass / mass, 4),
            }
            for key, s in sorted(self._sources.items())
            if s.completions
        }
        return {"sources": sources, **{k: round(v, 6) for k, v in self._grads.items()}}
