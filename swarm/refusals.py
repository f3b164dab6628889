"""Why a peer's descriptor or payload was refused: reasons counted by value, details for logs only.

Shared by selection (:mod:`swarm.selection`) and fetching (:mod:`swarm.exchange`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from protocol.errors import MessageRejected


class BatchRejection(StrEnum):
    """Why a peer's descriptor or payload was refused: a trust failure, counted by value.

    The values are the labels shown in metrics (``rejected_reasons``) and on the dashboard.
    """

    BAD_DESCRIPTOR = "bad descriptor"
    WRONG_SUBKEY = "descriptor under another peer's subkey"
    SIZE_MISMATCH = "size mismatch"
    DIGEST_MISMATCH = "digest mismatch"
    BAD_SIGNATURE = "bad signature"
    BAD_BATCH = "bad batch"
    PUBLISHER_MISMATCH = "publisher mismatch"
    ROUND_MISMATCH = "round mismatch"
    FUTURE_DATED = "future-dated descriptor"


@dataclass(frozen=True)
class Refusal:
    """A refused descriptor or payload: the reason to count, and details for the log only."""

    reason: BatchRejection
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.reason.value}: {self.detail}" if self.detail else self.reason.value


class PayloadRejected(MessageRejected):
    """A fetched payload that does not match its descriptor or does not open."""

    def __init__(self, reason: BatchRejection, detail: str = "") -> None:
        super().__init__(str(Refusal(reason, detail)))
        self.refusal = Refusal(reason, detail)
