"""What the dashboard shows, computed from ``metrics.jsonl`` files (one node's, or a whole local swarm's).

The files are the one source: :class:`MetricsTail` reads only the lines
appended since the last poll, :class:`NodeView` folds events into figures, and
:class:`SwarmView` gives the JSON for the page and the Prometheus text.
Held-out ``eval`` events are checked field by field (:meth:`Eval.parse`): a
malformed one is skipped, so one bad line never takes the dashboard down.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.dashboard.trend import Trend, node_verdict, swarm_line

SILENT_AFTER_S = 60.0
PEERS_KEPT = 256
"""Publishers a node's view remembers (the most recently seen): a flood of keys cannot grow the dashboard."""
PEERS_SHOWN = 32


def _real(value: Any) -> float | None:
    """``value`` as a finite float, or None: a JSON field may hold a string, a boolean, null or NaN instead."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    v = float(value)
    return v if math.isfinite(v) else None


def _fraction(value: Any) -> float | None:
    """``value`` as a float in [0, 1], or None: accuracies outside that range are corrupt, not figures."""
    v = _real(value)
    return v if v is not None and 0.0 <= v <= 1.0 else None


def _count(value: Any) -> int | None:
    """``value`` as a non-negative whole number, or None (``3.0`` counts; ``3.5``, ``-1`` and ``"3"`` do not)."""
    v = _real(value)
    return int(v) if v is not None and v >= 0 and v.is_integer() else None


def _families(value: Any) -> dict[str, float]:
    """Per-family accuracies, sorted by family; entries that are not accuracies are left out."""
    if not isinstance(value, dict):
        return {}
    fractions = {str(k): _fraction(v) for k, v in value.items()}
    return {k: v for k, v in sorted(fractions.items(), key=lambda kv: kv[0]) if v is not None}


def _dict(value: Any) -> dict[Any, Any]:
    """``value`` if it is a dict (a malformed field reads as empty)."""
    return value if isinstance(value, dict) else {}


@dataclass
class PeerRow:
    """What one node saw of one publisher over the rounds: batches taken, groups trained on, refusals."""

    last_time: float = 0.0
    last_round: int = 0
    batches: int = 0
    used: int = 0
    refused: int = 0


def _thin(keys: list[int], max_points: int) -> list[int]:
    """At most about ``max_points`` of the sorted ``keys``, evenly spaced, always with the last one."""
    step = max(1, -(-len(keys) // max_points))
    kept = keys[::step]
    if keys and kept[-1] != keys[-1]:
        kept.append(keys[-1])
    return kept


@dataclass(frozen=True)
class Eval:
    """One held-out evaluation, from an ``eval`` event (see ``EvalResult.to_event``)."""

    round: int
    accuracy: float
    sample_reward: float | None
    per_family: dict[str, float]
    time: float | None
    items: int | None
    complete: bool | None

    @classmethod
    def parse(cls, ev: dict[str, Any]) -> Eval | None:
        """The evaluation in ``ev``, or None when its round or accuracy is missing or malformed.

        Those two are what every held-out figure rests on, so without them the
        event is skipped; the other fields are extras and a bad one reads as
        unknown (None), a bad per-family entry as absent.
        """
        rnd, accuracy = _count(ev.get("round")), _fraction(ev.get("accuracy"))
        if rnd is None or accuracy is None:
            return None
        complete = ev.get("complete")
        return cls(
            round=rnd, accuracy=accuracy, sample_reward=_real(ev.get("sample_reward")),
            per_family=_families(ev.get("per_family")), time=_real(ev.get("time")), items=_count(ev.get("items")),
            complete=complete if isinstance(complete, bool) else None,
        )  # fmt: skip


class MetricsTail:
    """Incremental reader of one JSONL file: each poll returns the complete lines added since the last."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def poll(self) -> list[dict[str, Any]]:
        """New events (a torn or half-written last line waits for the next poll)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(0, 2)
                if f.tell() < self._offset:  # truncated or replaced: start over
                    self._offset, self._partial = 0, b""
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        out = []
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
        return out


@dataclass
class NodeView:
    """One node's figures, folded from its events."""

    peer: str = ""
    model: str = ""
    status: str = "starting"
    last_time: float = 0.0
    series: dict[int, tuple[float, float | None]] = field(default_factory=dict)
    last: dict[str, Any] = field(default_factory=dict)
    totals: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)
    sync_aborted: Counter[str] = field(default_factory=Counter)
    revision: int = 0
    state_hash: str = ""
    peers_seen: int = 0
    heldout_first: Eval | None = None
    heldout_last: Eval | None = None
    heldout_series: dict[int, float] = field(default_factory=dict)
    _bytes_base: Counter[str] = field(default_factory=Counter)
    peers: OrderedDict[str, PeerRow] = field(default_factory=OrderedDict)
    last_sync: dict[str, Any] = field(default_factory=dict)
    catch_ups: int = 0
    started: float | None = None
    multiaddrs: list[str] = field(default_factory=list)

    def add(self, ev: dict[str, Any]) -> None:
        """Fold one event in."""
        kind = ev.get("event")
        self.last_time = max(self.last_time, _real(ev.get("time")) or 0.0)
        if kind == "start":
            self.peer, self.model, self.status = ev.get("peer", ""), ev.get("model", ""), "running"
            self.started = _real(ev.get("time"))
            self.multiaddrs = [str(a) for a in ev.get("multiaddrs") or [] if isinstance(a, str)]
            for k in ("bytes_in", "bytes_out"):  # a restarted process counts from zero again
                self._bytes_base[k] += int(self.last.get(k) or 0)
            self.last = {}
        elif kind == "round":
            self._add_round(ev)
        elif kind == "sync":
            self._add_sync(ev)
        elif kind == "eval":
            self._add_eval(ev)
        elif kind == "done":
            self.status = "done"
        elif kind == "summary":
            self.status = "left"

    def _add_round(self, ev: dict[str, Any]) -> None:
        self.series[int(ev["round"])] = (float(ev.get("reward_mean") or 0.0), ev.get("external_reward_mean"))
        self.last = ev
        self.totals["rounds_run"] += 1
        for k in ("external_groups", "accepted_groups", "fetch_failed", "reward_mismatches", "dropped_zero_adv"):
            self.totals[k] += int(ev.get(k) or 0)
        reasons = ev.get("rejected_reasons") or {}
        self.rejected.update({str(k): int(v) for k, v in reasons.items()})
        unexplained = int(ev.get("external_rejected") or 0) - sum(int(v) for v in reasons.values())
        if unexplained > 0:
            self.rejected["other"] += unexplained
        self.peers_seen = max(self.peers_seen, int(ev.get("peers_seen") or 0))
        self._add_peers(ev)

    def _add_peers(self, ev: dict[str, Any]) -> None:
        """Fold the round's per-publisher counts into the peer rows (the ``PEERS_KEPT`` most recently seen)."""
        when, rnd = _real(ev.get("time")) or 0.0, _count(ev.get("round")) or 0
        used = {str(p)[-6:]: _count(n) or 0 for p, n in _dict(ev.get("external_peers")).items()}
        parts = [("batches", _dict(ev.get("batches_from"))), ("used", used), ("refused", _dict(ev.get("refused_from")))]
        for column, counts in parts:
            for peer, n in counts.items():
                row = self.peers.pop(str(peer), None) or PeerRow()
                row.last_time, row.last_round = when, rnd
                setattr(row, column, getattr(row, column) + (_count(n) or 0))
                self.peers[str(peer)] = row
        while len(self.peers) > PEERS_KEPT:
            self.peers.popitem(last=False)

    def sync_json(self, now: float) -> dict[str, Any] | None:
        """The last sync event's result, cause, group, duration, suspects and age; None before any."""
        if not self.last_sync:
            return None
        when = self.last_sync["time"]
        return {**self.last_sync, "age_s": None if when is None else max(0.0, now - when)}

    def peers_json(self, now: float) -> list[dict[str, Any]]:
        """The ``PEERS_SHOWN`` most recently seen peers, newest first."""
        shown = list(self.peers.items())[-PEERS_SHOWN:][::-1]
        return [{"peer": p, "age_s": max(0.0, now - r.last_time), "round": r.last_round, "batches": r.batches,
                 "used": r.used, "refused": r.refused} for p, r in shown]  # fmt: skip

    def _add_sync(self, ev: dict[str, Any]) -> None:
        self.revision, self.state_hash = int(ev.get("revision") or 0), str(ev.get("state_hash") or "")
        suspects = _dict(ev.get("suspect_peers"))
        self.last_sync = {
            "time": _real(ev.get("time")), "result": str(ev.get("reason") or ""), "cause": str(ev.get("cause") or ""),
            "group_size": _count(ev.get("group_size")), "sync_s": _real(ev.get("sync_s")),
            "suspects": {str(p)[-6:]: str(r) for p, r in list(suspects.items())[:8]},
        }  # fmt: skip
        self.catch_ups += bool(ev.get("caught_up"))
        self.totals["sync_bytes"] += int(ev.get("bytes_sent") or 0)
        if ev.get("committed"):
            self.totals["sync_committed"] += 1
        elif ev.get("reason") in ("no partner", "yielded"):  # nobody to sync with, or a group under way
            self.totals["sync_no_partner"] += 1
        else:  # the cause; files written before causes existed carry it in the reason
            self.sync_aborted[str(ev.get("cause") or ev.get("reason") or "unknown")] += 1

    def _add_eval(self, ev: dict[str, Any]) -> None:
        """Keep the first evaluation (the "start" of start -> now) and the latest, in file order."""
        result = Eval.parse(ev)
        if result is None:
            return
        if self.heldout_first is None:
            self.heldout_first = result
        self.heldout_last = result
        self.heldout_series[result.round] = result.accuracy

    def heldout_json(self, now: float, max_points: int) -> dict[str, Any] | None:
        """The node's held-out figures for the page; None until it has written an evaluation."""
        first, last = self.heldout_first, self.heldout_last
        if first is None or last is None:
            return None
        rounds = _thin(sorted(self.heldout_series), max_points)
        return {
            "accuracy": last.accuracy, "round": last.round, "sample_reward": last.sample_reward,
            "age_s": None if last.time is None else max(0.0, now - last.time), "per_family": dict(last.per_family),
            "items": last.items, "complete": last.complete, "first_accuracy": first.accuracy,
            "first_round": first.round, "series": [[r, self.heldout_series[r]] for r in rounds],
        }  # fmt: skip

    def verdict_json(self) -> dict[str, Any]:
        """Whether the node learns: held-out accuracy once evaluated twice, else the training reward."""
        heldout = sorted(self.heldout_series.items())
        items = self.heldout_last.items if self.heldout_last is not None else None
        rewards = [(r, self.series[r][0]) for r in sorted(self.series)]
        return node_verdict(heldout, items, rewards).to_json()

    def uptime_s(self, now: float) -> float | None:
        """Seconds since this node's process wrote its ``start`` event, while it runs."""
        if self.started is None or self.status != "running":
            return None
        return max(0.0, now - self.started)

    def bytes(self, direction: str) -> int:
        """Rollout payload bytes in or out over all of this node's runs."""
        return self._bytes_base[direction] + int(self.last.get(direction) or 0)

    def shown_status(self, now: float) -> str:
        """``running`` turns ``silent`` when nothing was written for a minute."""
        if self.status == "running" and now - self.last_time > SILENT_AFTER_S:
            return "silent"
        return self.status

    def to_json(self, now: float, max_points: int) -> dict[str, Any]:
        """The node's entry in the dashboard JSON."""
        rounds = sorted(self.series)
        series = [[r, *self.series[r]] for r in _thin(rounds, max_points)]
        t = self.totals
        return {
            "peer": self.peer[-6:], "peer_id": self.peer, "model": self.model, "status": self.shown_status(now),
            "round": rounds[-1] if rounds else 0, "reward": self.last.get("reward_mean"),
            "external_reward": self.last.get("external_reward_mean"), "peers_seen": self.peers_seen,
            "accepted": t["accepted_groups"], "used": t["external_groups"], "rejected": dict(self.rejected),
            "fetch_failed": t["fetch_failed"], "mismatches": t["reward_mismatches"],
            "dropped_zero_adv": t["dropped_zero_adv"], "sync_committed": t["sync_committed"],
            "sync_no_partner": t["sync_no_partner"],
            "sync_aborted": dict(self.sync_aborted), "revision": self.revision, "state_hash": self.state_hash[:12],
            "bytes_in": self.bytes("bytes_in"), "bytes_out": self.bytes("bytes_out"), "sync_bytes": t["sync_bytes"],
            "round_s": self.last.get("round_s"), "series": series, "heldout": self.heldout_json(now, max_points),
            "last_sync": self.sync_json(now), "catch_ups": self.catch_ups, "peers": self.peers_json(now),
            "banned_peers": _count(self.last.get("banned_peers")),
            "sample_tokens_per_s": _real(self.last.get("sample_tokens_per_s")),
            "train_tokens_per_s": _real(self.last.get("train_tokens_per_s")),
            "rss_mb": _real(self.last.get("rss_mb")), "children_rss_mb": _real(self.last.get("children_rss_mb")),
            "cpu_s": _real(self.last.get("cpu_s")), "children_cpu_s": _real(self.last.get("children_cpu_s")),
            "uptime_s": self.uptime_s(now), "join": join_command(self.multiaddrs), "trend": self.verdict_json(),
        }  # fmt: skip


class SwarmView:
    """The figures of every metrics file that ``discover()`` lists, refreshed on demand."""

    def __init__(self, title: str, discover: Callable[[], list[Path]], max_points: int = 400) -> None:
        self.title = title
        self._discover = discover
        self._max_points = max_points
        self._tails: dict[Path, MetricsTail] = {}
        self.nodes: dict[Path, NodeView] = {}
        self._lock = threading.Lock()

    def refresh(self) -> None:
        """Read what was appended to every file since the last refresh."""
        with self._lock:
            for path in self._discover():
                if path not in self._tails:
                    self._tails[path], self.nodes[path] = MetricsTail(path), NodeView()
                for ev in self._tails[path].poll():
                    self.nodes[path].add(ev)

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        """The JSON document the page polls."""
        self.refresh()
        now = time.time() if now is None else now
        nodes = [v.to_json(now, self._max_points) for v in self.nodes.values() if v.peer]
        keys = ("accepted", "used", "fetch_failed", "sync_committed", "bytes_in", "bytes_out", "sync_bytes")
        totals: dict[str, Any] = {k: sum(n[k] for n in nodes) for k in keys}
        totals["rejected"] = sum(sum(n["rejected"].values()) for n in nodes)
        totals["sync_aborted"] = sum(sum(n["sync_aborted"].values()) for n in nodes)
        totals["rounds"] = sum(n["round"] for n in nodes)
        totals["revision"] = max((n["revision"] for n in nodes), default=0)
        totals["peers_seen"] = max([len(nodes) - 1, *(n["peers_seen"] for n in nodes)]) if nodes else 0
        totals["nodes"] = len(nodes)
        totals["running"] = sum(n["status"] == "running" for n in nodes)
        totals.update(_heldout_totals(nodes))
        totals["verdict"] = swarm_line([Trend(n["trend"]["trend"]) for n in nodes])
        joinable = [n["join"] for n in nodes if n["join"] and n["status"] == "running"]
        totals["join"] = joinable[0] if joinable else None
        return {"title": self.title, "time": now, "version": version(), "totals": totals, "nodes": nodes}


def join_command(multiaddrs: list[str]) -> str | None:
    """The command others paste to join through this node, or None when it listens on no address.

    A node in client mode (behind a NAT, ``--client-mode``) announces no address: nobody can dial it.

    >>> join_command(["/ip4/127.0.0.1/tcp/4001/p2p/Qm1", "/ip4/10.0.0.5/tcp/4001/p2p/Qm1"])
    'swarm-node join --peer /ip4/10.0.0.5/tcp/4001/p2p/Qm1'
    >>> join_command([]) is None
    True
    """
    best = sorted(multiaddrs, key=lambda a: ("/127." in a or "/::1/" in a, "/tcp/" not in a, a))
    return f"swarm-node join --peer {best[0]}" if best else None


def version() -> str:
    """This installation's swarm-node version ("unknown" when run from a tree that is not installed)."""
    try:
        return importlib.metadata.version("swarm-node")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _heldout_totals(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean first and latest held-out accuracy over the nodes that evaluated (None when none did).

    Both means are over the same nodes, so the swarm's "start -> now" compares like with like.
    """
    evaluated = [n["heldout"] for n in nodes if n["heldout"] is not None]
    if not evaluated:
        return {"heldout_accuracy": None, "heldout_first_accuracy": None, "heldout_nodes": 0}
    return {
        "heldout_accuracy": sum(h["accuracy"] for h in evaluated) / len(evaluated),
        "heldout_first_accuracy": sum(h["first_accuracy"] for h in evaluated) / len(evaluated),
        "heldout_nodes": len(evaluated),
    }
