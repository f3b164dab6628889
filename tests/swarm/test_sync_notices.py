"""What an abort notice may name, and the bound on notices kept for rounds not yet registered (swarm/sync/notices.py).

The rounds that send and refuse notices run on the simulated network: tests/swarm/test_sync_sim_notices.py.
"""

from __future__ import annotations

from swarm.sync.config import AbortCause
from swarm.sync.notices import MAX_EARLY, EarlyNotices, cause_of, notice, worth_telling


def test_who_tells_and_what_a_notice_may_name() -> None:
    assert worth_telling(AbortCause.BAD_BYTES, 5.0)
    assert not worth_telling(AbortCause.ABORTED_BY_MEMBER, 5.0)  # a notice does not echo around the group
    assert not worth_telling(AbortCause.PEER_LOST, 0.1)  # at the deadline everyone ends the round anyway
    assert cause_of(notice("g", 0, AbortCause.PEER_LOST)) == "peer lost"
    assert cause_of({"cause": "x" * 4000}) == cause_of({"cause": 7}) == cause_of({}) == "unknown"


def test_early_notices_are_bounded_and_only_a_members_counts() -> None:
    early = EarlyNotices()
    for k in range(3 * MAX_EARLY):  # a flood of notices for groups never registered
        early.keep(f"group-{k}", f"peer-{k % 7}", "peer lost")
    assert len(early) == MAX_EARLY
    assert early.take("group-0", ["peer-0"]) is None  # the oldest went first
    last = 3 * MAX_EARLY - 1
    assert early.take(f"group-{last}", ["someone-else"]) is None  # not a member of that round
    assert early.take(f"group-{last}", [f"peer-{last % 7}"]) is None  # taken (and forgotten) just above
    early.keep("g", "m", "bad bytes")
    assert early.take("g", ["x", "m"]) == ("m", "bad bytes")
