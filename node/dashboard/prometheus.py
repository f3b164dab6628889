"""The dashboard's figures in the Prometheus text exposition format (version 0.0.4)."""

from __future__ import annotations

from typing import Any

from node.dashboard.trend import Trend

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# name, type, help; :func:`_samples` gives each one's values
METRICS: list[tuple[str, str, str]] = [
    ("swarm_node_up", "gauge", "1 while the node is running, else 0."),
    ("swarm_node_info", "gauge", "1, labelled with the swarm-node version serving the dashboard."),
    ("swarm_node_uptime_seconds", "gauge", "Seconds since the node's process started, while it runs."),
    ("swarm_node_learning", "gauge", "1 learning, 0 flat, -1 getting worse, beyond noise (absent: too early)."),
    ("swarm_node_round", "gauge", "Last completed round."),
    ("swarm_node_reward", "gauge", "Mean reward of the last round, by source (local or external)."),
    ("swarm_node_peers_seen", "gauge", "Distinct peers whose rollouts this node has seen."),
    ("swarm_node_external_groups_accepted_total", "counter", "External groups that passed verification."),
    ("swarm_node_external_groups_used_total", "counter", "External groups trained on."),
    ("swarm_node_external_rejected_total", "counter", "External batches or groups refused, by reason."),
    ("swarm_node_fetch_failed_total", "counter", "Payload fetches that failed (peer unreachable, timeout)."),
    ("swarm_node_reward_mismatches_total", "counter", "Completions whose claimed reward differed from ours."),
    ("swarm_node_zero_advantage_dropped_total", "counter", "Groups dropped because all rewards were equal."),
    ("swarm_node_sync_rounds_total", "counter", "Outer sync rounds, by result (committed, aborted or no_partner)."),
    ("swarm_node_sync_revision", "gauge", "Current outer-sync revision."),
    ("swarm_node_rollout_bytes_total", "counter", "Rollout payload bytes, by direction (in or out)."),
    ("swarm_node_sync_bytes_sent_total", "counter", "Bytes sent in outer-sync all-reduces."),
    ("swarm_node_round_seconds", "gauge", "Duration of the last round."),
    ("swarm_node_tokens_per_second", "gauge", "Tokens per second of the last round, by phase (sample or train)."),
    ("swarm_node_resident_memory_bytes", "gauge", "Resident memory, by process (node, or helpers: DHT and p2pd)."),
    ("swarm_node_cpu_seconds_total", "counter", "CPU seconds since start, by process (node, or helpers)."),
    ("swarm_node_heldout_accuracy", "gauge", "Greedy accuracy on the held-out questions at the last evaluation."),
    ("swarm_node_heldout_family_accuracy", "gauge", "Greedy held-out accuracy at the last evaluation, by family."),
    ("swarm_node_heldout_sample_reward", "gauge", "Mean reward of sampled held-out completions, last evaluation."),
    ("swarm_node_heldout_round", "gauge", "Round of the last held-out evaluation (0: before training)."),
]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    """Exact integers for counters (no exponent), shortest round-trip text for other floats."""
    v = float(value)
    return str(int(v)) if v.is_integer() else repr(v)


def _mb_to_bytes(mb: float | None) -> float | None:
    return None if mb is None else round(mb * 1024 * 1024)


TREND_VALUE = {Trend.LEARNING: 1.0, Trend.FLAT: 0.0, Trend.WORSE: -1.0}


def _samples(name: str, n: dict[str, Any], version: str) -> list[tuple[dict[str, str], float | None]]:
    """The (extra labels, value) pairs of metric ``name`` for one node."""
    heldout: dict[str, Any] = n.get("heldout") or {}  # no evaluation yet: no held-out samples at all
    families: dict[str, float] = heldout.get("per_family") or {}
    table: dict[str, list[tuple[dict[str, str], float | None]]] = {
        "swarm_node_up": [({}, float(n["status"] == "running"))],
        "swarm_node_info": [({"version": version}, 1.0)],
        "swarm_node_uptime_seconds": [({}, n.get("uptime_s"))],
        "swarm_node_learning": [({"source": n["trend"]["source"]}, TREND_VALUE.get(Trend(n["trend"]["trend"])))],
        "swarm_node_round": [({}, n["round"])],
        "swarm_node_reward": [({"source": "local"}, n["reward"]), ({"source": "external"}, n["external_reward"])],
        "swarm_node_peers_seen": [({}, n["peers_seen"])],
        "swarm_node_external_groups_accepted_total": [({}, n["accepted"])],
        "swarm_node_external_groups_used_total": [({}, n["used"])],
        "swarm_node_external_rejected_total": [({"reason": r}, v) for r, v in sorted(n["rejected"].items())],
        "swarm_node_fetch_failed_total": [({}, n["fetch_failed"])],
        "swarm_node_reward_mismatches_total": [({}, n["mismatches"])],
        "swarm_node_zero_advantage_dropped_total": [({}, n["dropped_zero_adv"])],
        "swarm_node_sync_rounds_total": [
            ({"result": "committed"}, n["sync_committed"]),
            ({"result": "aborted"}, sum(n["sync_aborted"].values())),
            ({"result": "no_partner"}, n.get("sync_no_partner", 0)),
        ],
        "swarm_node_sync_revision": [({}, n["revision"])],
        "swarm_node_rollout_bytes_total": [
            ({"direction": "in"}, n["bytes_in"]),
            ({"direction": "out"}, n["bytes_out"]),
        ],
        "swarm_node_sync_bytes_sent_total": [({}, n["sync_bytes"])],
        "swarm_node_round_seconds": [({}, n["round_s"])],
        "swarm_node_tokens_per_second": [
            ({"phase": "sample"}, n.get("sample_tokens_per_s")),
            ({"phase": "train"}, n.get("train_tokens_per_s")),
        ],
        "swarm_node_resident_memory_bytes": [
            ({"process": "node"}, _mb_to_bytes(n.get("rss_mb"))),
            ({"process": "helpers"}, _mb_to_bytes(n.get("children_rss_mb"))),
        ],
        "swarm_node_cpu_seconds_total": [
            ({"process": "node"}, n.get("cpu_s")),
            ({"process": "helpers"}, n.get("children_cpu_s")),
        ],
        "swarm_node_heldout_accuracy": [({}, heldout.get("accuracy"))],
        "swarm_node_heldout_family_accuracy": [({"family": f}, v) for f, v in sorted(families.items())],
        "swarm_node_heldout_sample_reward": [({}, heldout.get("sample_reward"))],
        "swarm_node_heldout_round": [({}, heldout.get("round"))],
    }
    return table[name]


def render(snapshot: dict[str, Any]) -> str:
    """Prometheus text for every node in a dashboard snapshot (labels: peer, model, and per metric)."""
    lines: list[str] = []
    for name, kind, help_text in METRICS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for node in snapshot["nodes"]:
            for extra, value in _samples(name, node, str(snapshot.get("version", "unknown"))):
                if value is None:
                    continue
                labels = {"peer": node["peer"], "model": node["model"], **extra}
                text = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
                lines.append(f"{name}{{{text}}} {_number(value)}")
    return "\n".join(lines) + "\n"
