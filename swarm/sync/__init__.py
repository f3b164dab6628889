"""Fault-tolerant DiLoCo outer sync (see :mod:`swarm.sync.outer` for the protocol and its time bound)."""

from __future__ import annotations

from swarm.fingerprint import model_fingerprint
from swarm.sync.config import AbortCause, OuterSyncConfig, SyncAborted, SyncOutcome, SyncReport
from swarm.sync.decide import CatchUp, CommitDecision, GroupDecision, decide_catch_up, decide_commit, decide_group
from swarm.sync.errors import BadBytes, GroupMismatch, StateDownloadFailed
from swarm.sync.outer import OuterSync
from swarm.sync.records import KINDS as RECORD_KINDS

__all__ = [
    "RECORD_KINDS",
    "AbortCause",
    "BadBytes",
    "CatchUp",
    "CommitDecision",
    "GroupDecision",
    "GroupMismatch",
    "OuterSync",
    "OuterSyncConfig",
    "StateDownloadFailed",
    "SyncAborted",
    "SyncOutcome",
    "SyncReport",
    "decide_catch_up",
    "decide_commit",
    "decide_group",
    "model_fingerprint",
]
