"""Poisoning through the only informative rows (issue 51), live: a victim process and an attacker peer.

The victim (tiny-s, warm-started, on ``rg:chain_sum`` with 48 new tokens: its own groups have little or no
signal) trains beside the attacker of tests/integration/attacker.py, whose ``junk`` publisher sends valid
groups of 64 completions that all state the right answer inside junk text, and whose ``watch`` peer
collects the victim's own published batches (what it writes). The victim's defences must hold: the
attacker's share of the informative rows and of the advantage mass of every step stays at its cap
(``--max-publisher-share``), the junk is refused by a counted reason, and it never appears in the victim's
own completions.

``JUNK_DEFENCE_OFF=1`` runs the same with both defences off (``--max-publisher-share 1
--external-max-logp-gap 0``) and only prints the numbers: how the attack fares without them.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.attacker import JUNK
from tests.integration.nodes import Swarm, wait_for
from tests.integration.test_attacks import start_attacker

pytestmark = [pytest.mark.network, pytest.mark.slow]

SHARE = 0.34  # the default --max-publisher-share
ATTACK_S = 100.0
ATTACKER_SOURCE = "ext:tiny-s"  # the model the junk publisher claims (the victim has no other peer)
VICTIM = (
    "--model", "tiny-s", "--task", "rg:chain_sum", "--warm-start", "30", "--max-new-tokens", "48",
    "--local", "4", "--external", "4", "--generations", "8", "--seed", "1", "--rounds", "0", "--diagnose-groups",
)  # fmt: skip
OFF = ("--max-publisher-share", "1", "--external-max-logp-gap", "0")


def observed(out: Path, victim: str) -> list[str]:
    """The victim's own completions the watcher collected."""
    path = out / "observed.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [c for line in lines for e in [json.loads(line)] if e["publisher"] == victim for c in e["completions"]]


def attacker_shares(r: dict[str, Any]) -> tuple[float, float]:
    """The attacker's share of a step's trained rows (all informative: groups without signal are dropped) and
    of its advantage mass, from the victim's per-source diagnostics."""
    sources = r["trained_sources"]
    rows = sum(s["completions"] for s in sources.values())
    mine = sources.get(ATTACKER_SOURCE, {})
    return mine.get("completions", 0) / max(rows, 1), float(mine.get("adv_share", 0.0))


def test_junk_around_right_answers_neither_dominates_a_step_nor_spreads(swarm: Swarm) -> None:
    off = os.environ.get("JUNK_DEFENCE_OFF") == "1"
    victim = swarm.spawn("victim", *VICTIM, *(OFF if off else ()))
    swarm.go()
    wait_for(lambda: len(victim.rounds()) >= 3, 120, "the victim's first rounds")
    attacker, out = start_attacker(swarm, victim.ready["multiaddrs"][0], "--attacks", "junk,watch")
    t0 = time.time()
    wait_for(lambda: time.time() - t0 > ATTACK_S, ATTACK_S + 30, "the attack to run", poll=1.0, watch=[attacker])
    attacker.kill()
    assert victim.proc.alive(), victim.log()

    hit = [r for r in victim.rounds() if r["time"] >= t0]
    own = observed(out, victim.peer_id)
    junk_written = sum(JUNK.strip() in c for c in own)
    reasons: dict[str, int] = {}
    for r in hit:
        for k, v in r["rejected_reasons"].items():
            reasons[k] = reasons.get(k, 0) + v
    shares = [attacker_shares(r) for r in hit if r["trained_groups"]]
    figures = {
        "rounds": len(hit), "trained_steps": len(shares), "own_completions_seen": len(own),
        "own_with_junk": junk_written, "max_row_share": max((s[0] for s in shares), default=0.0),
        "max_adv_share": max((s[1] for s in shares), default=0.0),
        "steps_with_attacker": sum(s[0] > 0 for s in shares), "reasons": reasons,
        "attacker_rows": sum(r["source_rows"].get(k, 0) for r in hit for k in r["source_rows"]),
    }  # fmt: skip
    print(json.dumps({"defence_off": off, **figures}, indent=1))
    if off:
        return
    assert len(hit) >= 10, figures
    assert len(own) >= 64, f"the watcher saw too few of the victim's completions: {figures}"
    assert reasons.get("completion over generation budget", 0) == 0, figures  # the junk fits the budget
    # the junk arrived, was verified (right answers) and cut at training, by a counted reason: here the cap
    # alone (the victim's own groups have no signal, so one peer beside them keeps nothing; a warm-started
    # tiny-s scores all text alike, so the plausibility gate has nothing to tell: tests/node/test_poisoning.py)
    cut = reasons.get("text implausible here", 0) + reasons.get("over publisher share of step", 0)
    assert cut > 0, figures
    assert figures["max_row_share"] <= SHARE + 1e-6 and figures["max_adv_share"] <= SHARE + 1e-3, figures
    assert junk_written == 0, figures
