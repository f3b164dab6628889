"""One sync round's input and outcome, and how the outcome goes into the weights (see :mod:`swarm.sync.runner`)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from swarm.sync.allreduce import Snapshot
from swarm.sync.config import SyncReport
from swarm.sync.robust import as_array
from swarm.sync.wire import MAX_WEIGHT


@dataclass(frozen=True)
class SyncJob:
    """What one round averages, taken on the training thread: the anchor it started from and the weights then.

    The round itself never reads the module, so training may go on while it runs
    (:class:`swarm.sync.runner.SyncRunner`).
    """

    base: Snapshot
    params: torch.Tensor
    steps: int = 1
    """Inner steps trained since ``base`` (a catch-up keeps them: see :meth:`OuterSync.apply`)."""
    step: int | None = None
    """The caller's inner step when the job was taken (None: not told); a commit makes it the anchor's step."""

    @cached_property
    def pseudo(self) -> torch.Tensor:
        """This member's pseudo-gradient: its own progress since the anchor, negated (computed once)."""
        return torch.from_numpy(np.subtract(as_array(self.base.anchor), as_array(self.params)))

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
    (see :meth:`swarm.sync.outer.OuterSync.apply`).

    After a commit, ``params_now - job.params`` is exactly zero when nothing was
    trained meanwhile, so a blocking sync leaves the weights bit-identical to
    the group's anchor.
    """
    assert outcome.installed is not None
    job = outcome.job
    since = job.params if outcome.report.committed else job.base.anchor
    # (params_now - since) first, then added to the anchor: the same two roundings as before, computed in
    # params_now's own memory (the caller's fresh copy of the weights: no other full-size vector)
    out = as_array(params_now)
    np.subtract(out, as_array(since), out=out)
    return torch.from_numpy(np.add(as_array(outcome.installed.anchor), out, out=out))
