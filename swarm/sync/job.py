"""One sync round's input and outcome, and how the outcome goes into the weights (see :mod:`swarm.sync.runner`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from swarm.sync.allreduce import Snapshot
from swarm.sync.config import SyncReport
from swarm.sync.robust import as_array
from swarm.sync.tensors import float_params
from swarm.sync.wire import MAX_WEIGHT


@dataclass(frozen=True)
class SyncJob:
    """What one round averages, taken on the training thread: the anchor it started from and this member's
    progress since it (the progress, not the weights: :func:`apply_outcome` needs no more).

    The round itself never reads the module, so training may go on while it runs
    (:class:`swarm.sync.runner.SyncRunner`).
    """

    base: Snapshot
    pseudo: torch.Tensor
    """This member's pseudo-gradient: its own progress since the anchor, negated (``anchor - weights``)."""
    steps: int = 1
    """Inner steps trained since ``base`` (a catch-up keeps them: see :meth:`OuterSync.apply`)."""
    step: int | None = None
    """The caller's inner step when the job was taken (None: not told); a commit makes it the anchor's step."""
    blocking: bool = False
    """Nothing trains until the outcome is applied (:meth:`OuterSync.sync_now`): the round writes the average
    into ``pseudo``'s memory (one model-sized vector fewer at its peak), and a commit sets the weights to the
    new anchor, which is what ``(now - anchor) + pseudo + new anchor`` gives when nothing was trained."""

    @classmethod
    def taken(cls, base: Snapshot, weights: torch.Tensor, steps: int = 1, step: int | None = None) -> SyncJob:
        """The job of ``weights``, a fresh float32 copy of the module's: the pseudo-gradient is computed in
        its memory (it is overwritten)."""
        w = as_array(weights)
        np.subtract(as_array(base.anchor), w, out=w)
        return cls(base, weights, steps, step)

    def rebased(self, base: Snapshot) -> SyncJob:
        """This job on another anchor, the weights kept: its pseudo-gradient becomes ``base.anchor - weights``.

        A merge (:mod:`swarm.sync.merge`) moves a peer onto another history's anchor without touching its
        weights: everything it trained since the fork, its old history's outer steps included, is then its
        part in that history's next average. :func:`apply_outcome` of the rebased job leaves the weights
        as they are unless the round commits.
        """
        pseudo = self.pseudo.clone()
        out = as_array(pseudo)
        np.add(out, as_array(base.anchor), out=out)
        np.subtract(out, as_array(self.base.anchor), out=out)
        return SyncJob(base, pseudo, self.steps, self.step, self.blocking)

    @property
    def weight(self) -> int:
        """What this member's part counts for in the average (the wire header's ``weight``).

        0 when nothing was trained since the anchor (a zero part would only
        dilute the mean: no part is sent), else the inner steps, at least 1
        and at most what the wire accepts.
        """
        if not as_array(self.pseudo).any():
            return 0
        return min(max(self.steps, 1), MAX_WEIGHT)


@dataclass(frozen=True)
class RoundOutcome:
    """What one round (catch-up included) ended with; ``OuterSync.apply`` puts it into the weights."""

    report: SyncReport
    job: SyncJob
    installed: Snapshot | None
    """The state this round moved to (a commit, or a catch-up only), None if it kept its own."""


def weights_after(outcome: RoundOutcome, params_now: torch.Tensor) -> torch.Tensor:
    """The weights once ``outcome`` is applied to weights ``params_now``, computed in ``params_now``'s memory
    (see :meth:`swarm.sync.outer.OuterSync.apply`)."""
    assert outcome.installed is not None
    _apply_slice(outcome, as_array(params_now), 0)
    return params_now


def apply_outcome(outcome: RoundOutcome, module: torch.nn.Module) -> None:
    """Put ``outcome`` into ``module``'s parameters, each in its own memory where it is float32 on the CPU
    (no full-size copy of the weights: at 50M parameters that is 200 MB at the round's end)."""
    assert outcome.installed is not None
    offset = 0
    with torch.no_grad():
        for p in float_params(module):
            inplace = p.dtype == torch.float32 and p.device.type == "cpu" and p.is_contiguous()
            flat = p.detach().view(-1) if inplace else p.detach().reshape(-1).to(torch.float32)
            _apply_slice(outcome, as_array(flat), offset)
            if not inplace:
                p.copy_(flat.view_as(p).to(p.dtype))
            offset += p.numel()


def _apply_slice(outcome: RoundOutcome, out: np.ndarray, offset: int) -> None:
    """``out`` (the weights now at ``offset`` of the flat vector) <- the installed anchor plus the progress to keep.

    A commit keeps what was trained since the job was taken: ``now - (anchor - pseudo)``, computed as
    ``(now - anchor) + pseudo``, which is exactly zero when nothing was trained (``fl(a - b) = -fl(b - a)``),
    so a blocking sync leaves the weights bit-identical to the group's anchor. A catch-up only keeps all
    progress since the old anchor: ``now - anchor``.
    """
    assert outcome.installed is not None
    job, end = outcome.job, offset + out.size
    if job.blocking and outcome.report.committed:  # the round spent ``pseudo``; nothing was trained since
        np.copyto(out, as_array(outcome.installed.anchor)[offset:end])
        return
    np.subtract(out, as_array(job.base.anchor)[offset:end], out=out)
    if outcome.report.committed:
        np.add(out, as_array(job.pseudo)[offset:end], out=out)
    np.add(out, as_array(outcome.installed.anchor)[offset:end], out=out)
