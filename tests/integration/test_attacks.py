"""Three honest nodes against an attacker peer (tests/integration/attacker.py): every attack at once, with numbers.

The swarm first runs alone (the baseline), then the attacker joins and keeps
flooding, replaying, dumping garbage into the DHT and publishing poisoned,
slow, silent and forged batches. The defences must hold by the issue's bar:
no node exits; honest nodes still get at least half their external groups
from each other, from every honest peer, and at a rate far from starved; a
round spends no longer on the network than on its own generation (the network
at most doubles a round's work, whatever the attacker's CPU does to the
generation itself); each honest process tree
grows by a bounded amount; and the poisoned batches are refused by a counted
reason.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.integration.nodes import NodeProc, Swarm, wait_for
from tests.procs import PYTHON, Proc

pytestmark = [pytest.mark.network, pytest.mark.slow]

# 12 new tokens: rounds that do some local work (tens of ms), so what is measured is what the network costs a
# round that has work of its own, as every real model's does
COMMON = ("--rounds", "0", "--local", "2", "--external", "4", "--generations", "4", "--max-new-tokens", "12", "--seed")
QUOTA = 4  # rows one peer may supply to a step: the default --max-source-share 0.5 x I (2) x G (4)
WARMUP_ROUNDS = 3  # first rounds: imports, first connections
ATTACK_S = 75.0  # more than two 30 s DHT windows: flood and replay are refreshed into each


def _tree_sum(pid: int, measure: Callable[[psutil.Process], float]) -> float:
    """``measure`` summed over a process and all its live descendants (node, DHT child, p2pd)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            total += measure(p)
        except psutil.NoSuchProcess:
            continue
    return total


def tree_rss(pid: int) -> float:
    """Resident bytes of a process tree."""
    return _tree_sum(pid, lambda p: float(p.memory_info().rss))


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by a process tree."""
    return _tree_sum(pid, lambda p: p.cpu_times().user + p.cpu_times().system)


def rounds_between(n: NodeProc, t0: float, t1: float) -> list[dict[str, Any]]:
    return [r for r in n.rounds() if t0 <= r["time"] <= t1]


def honest_external(rounds: list[dict[str, Any]], honest: set[str]) -> tuple[int, int]:
    """(external groups trained from honest peers, all external groups trained) over ``rounds``."""
    from_honest = sum(c for r in rounds for p, c in r["external_peers"].items() if p in honest)
    return from_honest, sum(r["external_groups"] for r in rounds)


def span(rounds: list[dict[str, Any]]) -> float:
    """Seconds from the first to the last of ``rounds`` (at least a millisecond)."""
    return max(rounds[-1]["time"] - rounds[0]["time"], 1e-3) if rounds else 1e-3


@dataclass
class Figures:
    """One honest node's numbers before and under the attack."""

    rounds: int
    honest_share: float
    honest_per_round_before: float
    honest_per_round: float
    honest_per_s_before: float
    honest_per_s: float
    honest_peers_heard: int
    median_round_s_before: float
    median_round_s: float
    rejected: dict[str, int]
    # median seconds per phase, before -> under the attack: what a slower round spent its time on
    phases: dict[str, tuple[float, float]]
    rss_growth_mb: float = 0.0
    # the amplifier's most rows and advantage mass in one step, and the completions cut from its groups
    amplifier_rows: int = 0
    amplifier_adv: float = 0.0
    amplifier_trimmed: int = 0

    @classmethod
    def of(cls, n: NodeProc, base: list[dict[str, Any]], hit: list[dict[str, Any]], honest: set[str]) -> Figures:
        (h0, _), (h1, all1) = honest_external(base, honest), honest_external(hit, honest)
        reasons: dict[str, int] = {}
        for r in hit:
            for k, v in r["rejected_reasons"].items():
                reasons[k] = reasons.get(k, 0) + v
        return cls(
            rounds=len(hit),
            honest_share=h1 / max(all1, 1),
            honest_per_round_before=h0 / max(len(base), 1),
            honest_per_round=h1 / max(len(hit), 1),
            honest_per_s_before=h0 / span(base),
            honest_per_s=h1 / span(hit),
            honest_peers_heard=len({p for r in hit for p in r["external_peers"] if p in honest}),
            median_round_s_before=statistics.median(r["round_s"] for r in base),
            median_round_s=statistics.median(r["round_s"] for r in hit) if hit else float("inf"),
            rejected=reasons,
            phases={k: (_median(base, k), _median(hit, k)) for k in ("generate_s", "share_s", "train_s", "collect_s")},
        )


def _median(rounds: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in rounds if r.get(key) is not None]  # collect_s: only rounds that ingested one
    return statistics.median(values) if values else float("nan")


def start_attacker(swarm: Swarm, peer: str, *extra: str) -> tuple[Proc, Path]:
    out = swarm.tmp / "attacker"
    # niced: on this shared machine the attacker's own work (6 hivemind hosts, signing and storing
    # hundreds of records; ~1.3 of 2 cores unniced) would otherwise be charged to the honest rounds;
    # a real attacker brings its own CPU. What it sends is unchanged.
    cmd = ["nice", "-n", "19", PYTHON, "-m", "tests.integration.attacker", "--peer", peer, "--dir", str(out)]
    proc = swarm.procs.start("attacker", [*cmd, "--duration", str(ATTACK_S + 150), *extra])  # past every wait below
    wait_for(lambda: (out / "attacker.ready").exists(), 90, "the attacker to join", poll=0.25, watch=[proc])
    return proc, out


def _cycled(out: Path) -> bool:
    """Whether the attacker finished a whole DHT cycle (flood, replay, garbage), by its last report.

    Niced on a loaded 2-core machine its first cycle can outlast ATTACK_S, and a report read then lacks
    the later steps; the rounds are counted over the longer span.
    """
    try:
        return int(json.loads((out / "attacker.json").read_text()).get("dht_cycles", 0)) >= 1
    except (OSError, ValueError):
        return False


def test_honest_swarm_holds_against_every_attack_at_once(swarm: Swarm) -> None:
    nodes = [
        swarm.spawn("a", *COMMON, "1", "--model", "tiny-s"),
        swarm.spawn("b", *COMMON, "2", "--model", "tiny-m"),
        swarm.spawn("c", *COMMON, "3", "--model", "tiny-gpt2"),
    ]
    honest = {n.peer_id for n in nodes}
    swarm.go()

    def heard_all(n: NodeProc) -> bool:
        return {m.peer_id for m in nodes if m is not n} <= {p for r in n.rounds() for p in r["external_peers"]}

    wait_for(lambda: all(len(n.rounds()) >= 12 and heard_all(n) for n in nodes), 180, "a baseline of 12 rounds each")
    t_base0 = min(n.rounds()[WARMUP_ROUNDS]["time"] for n in nodes)
    t_attack = time.time()
    rss_before = {n.name: tree_rss(n.proc.pid) for n in nodes}

    attacker, out = start_attacker(swarm, nodes[0].ready["multiaddrs"][0])
    t_joined = time.time()
    wait_for(lambda: time.time() - t_joined > ATTACK_S and _cycled(out), ATTACK_S + 120, "every attack to run once",
             poll=1.0, watch=[attacker])  # fmt: skip
    t_end = time.time()
    report = json.loads((out / "attacker.json").read_text())
    report["cpu_share_of_machine"] = tree_cpu_s(attacker.pid) / (t_end - t_joined) / (psutil.cpu_count() or 1)
    rss_after = {n.name: tree_rss(n.proc.pid) for n in nodes}
    # the attacker's clean exit is not under test: on SIGTERM it shuts its six hosts one by one, which
    # held the teardown 20 s (11.5 s without it)
    attacker.kill()

    for n in nodes:
        assert n.proc.alive(), f"{n.name} exited under attack:\n{n.log()}"
    figures = {
        n.name: Figures.of(n, rounds_between(n, t_base0, t_attack), rounds_between(n, t_joined, t_end), honest)
        for n in nodes
    }
    amplifier = json.loads((out / "attacker-ids.json").read_text())["amplify"]
    for n in nodes:
        f, hit = figures[n.name], rounds_between(n, t_joined, t_end)
        f.rss_growth_mb = (rss_after[n.name] - rss_before[n.name]) / 2**20
        f.amplifier_rows = max(r["source_rows"].get(amplifier, 0) for r in hit)
        f.amplifier_adv = max(r["source_adv"].get(amplifier, 0.0) for r in hit)
        f.amplifier_trimmed = sum(r["trimmed_completions"] for r in hit)
    print(json.dumps({"attacker": report, "nodes": {k: asdict(v) for k, v in figures.items()}}, indent=1))
    assert report["flood_sent"] > 0 and report["replay_sent"] > 0 and report["garbage_sent"] >= 40
    for name, f in figures.items():
        assert f.rounds >= 10, f"{name}: only {f.rounds} rounds under attack"
        assert f.honest_share >= 0.5, f"{name}: honest share {f.honest_share:.2f} under the flood"
        assert f.honest_peers_heard == len(honest) - 1, f"{name}: trained on {f.honest_peers_heard} honest peers"
        # Starvation would be ~0. What remains is the DHT's pace: the attacker's slow DHT hosts are among the
        # replicas every store and every latest-value read waits for, so collects take 0.03-0.10 -> 0.44-0.53 s
        # and each honest publisher gets ~2 batches a second stored. Measured on 2 shared cores: 29-51 -> 4.5-6.0
        # honest groups per second (0.22-0.37x per round: rounds no longer wait for collects, and take them
        # when they land).
        assert f.honest_per_s >= 1.0, (
            f"{name}: {f.honest_per_s:.2f} honest external groups per second, {f.honest_per_s_before:.2f} before"
        )
        # A round waits for the network at most --network-wait (0.05 s), never longer than its own generation
        # took, and only for a collect that recent ones say can land in that time: the network at most doubles
        # a round's own work. So what is checked is the time a round spent on the network (share_s: publish,
        # wait, ingest) against its own generation, not wall time: the attacker's CPU on 2 shared cores slows
        # generation itself (CI: b's 0.036 -> 0.069 s, median round 0.041 -> 0.083 s, 2.03x, with share_s
        # 0.0016 -> 0.00006 s), which says nothing about the defence. When each round waited for its own publish
        # and collect (--wait-network): 0.06-0.09 -> 0.33-0.43 s per round, share_s several times generate_s.
        net, own = f.phases["share_s"][1], f.phases["generate_s"][1]
        assert net <= own, f"{name}: median {net:.3f}s on the network per round under attack, {own:.3f}s generating"
        # the amplifier's 64-completion groups: cut to G (4), and at most 0.5 x I x G = 4 rows and as much
        # advantage mass per step (--max-source-share)
        assert f.amplifier_trimmed > 0, f"{name}: never ingested the amplifier's groups"
        assert f.amplifier_rows <= QUOTA and f.amplifier_adv <= QUOTA + 1e-6, f"{name}: {f}"
        for reason in ("completion over generation budget", "family not trained here", "digest mismatch"):
            assert f.rejected.get(reason, 0) > 0, f"{name}: no refusal for {reason!r}: {f.rejected}"
        assert f.rss_growth_mb < 100, f"{name}: process tree grew {f.rss_growth_mb:.0f} MB"
