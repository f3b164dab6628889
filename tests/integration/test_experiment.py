"""``swarm-node experiment`` end to end: 2 splits x 1 seed of a 2-node swarm, then a resume; a run stopped
part-way that goes on from its nodes' checkpoints."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from node.experiments.sweep import Run
from node.observe.metrics import read_events
from tests.procs import PYTHON, Procs, wait_for

pytestmark = [pytest.mark.network, pytest.mark.slow]


def experiment(procs: Procs, out: Path, name: str) -> tuple[int, str]:
    """Exit status and output (stdout and stderr) of one ``swarm-node experiment`` run, bounded at 240 s."""
    cmd = [PYTHON, "-m", "node", "experiment", "--nodes", "2", "--splits", "4/0,2/2", "--seeds", "1"]
    cmd += ["--rounds", "4", "--models", "tiny-s", "--tasks", "max", "--out", str(out), "--no-progress"]
    # paced: unpaced, 4 tiny rounds take ~80 ms, and a peer's batch sometimes landed only after the last one
    cmd += ["--min-generate", "0.3"]
    run = procs.start(name, cmd)
    return run.wait(240), run.output()


def test_experiment_writes_results_table_and_plots_then_resumes(procs: Procs, tmp_path: Path) -> None:
    out = tmp_path / "exp"
    code, first = experiment(procs, out, "first")
    assert code == 0, first[-6000:]
    assert "2 runs finished (0 from before)" in first

    data = json.loads((out / "results.json").read_text())
    assert [(s["split"], s["seeds"]) for s in data["summary"]] == [("4/0", 1), ("2/2", 1)]
    assert data["summary"][0]["ratio"] == pytest.approx(1.0)
    for r in data["runs"]:
        assert len(r["nodes"]) == 2 and all(len(n["curve"]) == 4 for n in r["nodes"])
        assert r["cumulative"] >= 0.0
    shared = next(r for r in data["runs"] if r["split"] == "2/2")
    assert sum(n["external_groups"] for n in shared["nodes"]) > 0, "the 2/2 run must train on external groups"

    # held-out accuracy before the first round and after the last, every node, paired against 4/0
    assert [(h["split"], h["seeds"]) for h in data["heldout"]] == [("4/0", [0]), ("2/2", [0])]
    for r in data["runs"]:
        assert all([x[0] for x in n["heldout"]] == [0, 4] for n in r["nodes"])
        assert all(n["cpu_s"] > 0 for n in r["nodes"])
    assert len(data["heldout"][1]["ratios"]) == 1
    table = (out / "results.md").read_text()
    label = Run("advantage", 4, 0, 0).label  # a node's default sampling and objective
    assert f"| {label} | 4/0 | 1 |" in table and f"| {label} | 2/2 | 1 |" in table
    assert f"questions per evaluation), paired by seed against {label} 4/0" in table
    assert "sampled twice a second during each of 2 runs" in table  # the protocol records the machine's load
    for load in (out / "runs").glob("*/*/seed0/load.json"):
        assert json.loads(load.read_text())["mean"] > 0
    for png in ("reward_curves.png", "cumulative.png", "heldout.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    metrics = list((out / "runs").glob("*/*/seed0/*/metrics.jsonl"))
    assert len(metrics) == 4
    markers = list((out / "runs").glob("*/*/seed0/DONE"))
    assert len(markers) == 2
    stamp = {m: m.stat().st_mtime_ns for m in markers}

    code, again = experiment(procs, out, "again")  # everything finished: nothing is rerun, outputs are rebuilt
    assert code == 0, again[-3000:]
    assert "2 runs finished (2 from before)" in again
    assert {m: m.stat().st_mtime_ns for m in markers} == stamp


def test_a_stopped_run_goes_on_from_its_nodes_checkpoints(procs: Procs, tmp_path: Path) -> None:
    """A synced run stopped at round 3 or later (SIGTERM, as at the end of a working session) resumes: same
    peers, their rounds continue, every node scores the start and the end, and the parts' times add up."""
    out = tmp_path / "exp"
    cmd = [PYTHON, "-m", "node", "experiment", "--nodes", "2", "--splits", "2/2", "--sync-every", "2"]
    cmd += ["--seeds", "1", "--rounds", "8", "--models", "tiny-s", "--tasks", "max", "--out", str(out)]
    cmd += ["--no-progress", "--min-generate", "0.3", "--checkpoint-every", "2"]
    run_dir = out / Run("advantage", 2, 2, 0, sync_every=2).name

    def rounds() -> dict[str, int]:
        return {
            p.parent.name: max((int(e["round"]) for e in read_events(p, "round")), default=0)
            for p in run_dir.glob("*/metrics.jsonl")
        }

    first = procs.start("first", cmd)
    wait_for(lambda: len(rounds()) == 2 and min(rounds().values()) >= 3, 180, "both nodes past round 3", watch=[first])
    first.send(signal.SIGTERM)
    assert first.wait(120) == 130, first.output()[-3000:]
    stopped = rounds()
    assert not (run_dir / "DONE").exists() and max(stopped.values()) < 8, stopped
    assert json.loads((run_dir / "load.json").read_text())["parts"] == 1

    second = procs.start("second", cmd)
    assert second.wait(240) == 0, second.output()[-6000:]
    assert "1 runs finished (0 from before)" in second.output()
    assert "goes on from its nodes' checkpoints" in second.output()
    assert set(rounds()) == set(stopped)  # the same two peers, not two new ones
    for path in run_dir.glob("*/metrics.jsonl"):
        (resume,) = list(read_events(path, "resume"))
        assert 2 <= resume["round"] <= stopped[path.parent.name]
    (result,) = json.loads((out / "results.json").read_text())["runs"]
    for node in result["nodes"]:
        assert len(node["curve"]) == 8 and [r for r, _ in node["heldout"]] == [0, 8]
    load = json.loads((run_dir / "load.json").read_text())
    assert load["parts"] == 2 and result["wall_s"] == pytest.approx(load["wall_s"])
    assert "1 of them ran in parts" in (out / "results.md").read_text()
