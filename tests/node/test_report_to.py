"""``--report-to``: per-round scalars to TensorBoard (read back from its event files), refused without its package."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from node.cli.experiment import config_from_args
from node.cli.main import build_parser, main
from node.core.options import REPORT_TO, NodeOptions, check_options
from node.experiments.config import ExperimentConfig
from node.experiments.sweep import local_command, plan_runs
from node.observe.metrics import MetricsWriter, read_events
from node.observe.report_to import (
    EVAL_SCALARS,
    ROUND_SCALARS,
    TENSORBOARD_FOLDER,
    ReportingWriter,
    ScalarFeed,
    TensorBoardSink,
    metrics_writer,
)
from tests.procs import PYTHON, Procs

HAS_WANDB = importlib.util.find_spec("wandb") is not None
needs_tensorboard = pytest.mark.skipif(
    importlib.util.find_spec("tensorboard") is None, reason="pip install tensorboard"
)


def _scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the TensorBoard event files under ``folder``: tag -> [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_every_choice_but_none_has_a_backend(tmp_path: Path) -> None:
    assert REPORT_TO[0] == "none" and NodeOptions().report_to == "none"  # off by default
    assert metrics_writer(tmp_path / "m.jsonl", "none", "n", "g").__class__ is MetricsWriter


def test_a_feed_logs_rounds_and_evaluations_at_their_round_and_counts_syncs() -> None:
    feed = ScalarFeed()
    assert feed.take({"event": "eval", "round": 0, "accuracy": 0.25, "sample_reward": None}) == (
        0, {"heldout/accuracy": 0.25}
    )  # fmt: skip
    step, values = feed.take({"event": "round", "round": 1, "reward_mean": 0.5, "loss": None, "trained_groups": 3}) or (
        -1, {}
    )  # fmt: skip
    assert (step, values) == (1, {"reward/local": 0.5, "groups/trained": 3.0})  # no sync tried yet: no sync scalars
    assert feed.take({"event": "sync", "committed": True}) is None
    assert feed.take({"event": "sync", "committed": False}) is None
    _, values = feed.take({"event": "round", "round": 2, "reward_mean": 0.75}) or (-1, {})
    assert values == {"reward/local": 0.75, "sync/commits": 1.0, "sync/attempts": 2.0}
    assert feed.take({"event": "start", "peer": "x"}) is None


@needs_tensorboard
def test_tensorboard_event_files_hold_each_rounds_scalars_with_the_round_as_step(tmp_path: Path) -> None:
    writer = ReportingWriter(tmp_path / "metrics.jsonl", TensorBoardSink(tmp_path / TENSORBOARD_FOLDER))
    writer.write("eval", round=0, accuracy=0.125, sample_reward=0.25, items=8)
    for r in (1, 2, 3):
        writer.write("round", round=r, reward_mean=r / 4, external_reward_mean=None, local_groups=4, external_groups=r,
                     trained_groups=r + 1, loss=0.5, lr=1e-3, round_s=0.25)  # fmt: skip
    writer.write("sync", committed=True)
    writer.write("round", round=4, reward_mean=1.0)
    writer.write("eval", round=4, accuracy=0.5, sample_reward=0.75, items=8)
    writer.close()
    got = _scalars(tmp_path / TENSORBOARD_FOLDER)
    assert got["reward/local"] == [(1, 0.25), (2, 0.5), (3, 0.75), (4, 1.0)]
    assert got["groups/external"] == [(1, 1.0), (2, 2.0), (3, 3.0)] and got["groups/trained"][0] == (1, 2.0)
    assert got["heldout/accuracy"] == [(0, 0.125), (4, 0.5)] and got["heldout/sample_reward"][1] == (4, 0.75)
    assert got["sync/commits"] == [(4, 1.0)]
    assert "reward/external" not in got  # None is no measurement
    assert [e["round"] for e in read_events(tmp_path / "metrics.jsonl", "round")] == [1, 2, 3, 4]  # the file as ever


@pytest.mark.skipif(HAS_WANDB, reason="wandb is installed here")
def test_report_to_without_its_package_names_the_pip_command(capsys: pytest.CaptureFixture[str]) -> None:
    # a bad model too: were the check missing, the node would refuse the model instead of starting
    assert main(["start", "--report-to", "wandb", "--model", "no-such-model"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pip install 'swarm-node[wandb]'" in err and "drop --report-to" in err
    with pytest.raises(ValueError, match=r"pip install 'swarm-node\[wandb\]'"):
        config_from_args(build_parser().parse_args(["experiment", "--report-to", "wandb"]))


def test_a_missing_tensorboard_is_refused_before_the_node_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def without_tensorboard(name: str, *args: Any) -> Any:
        return None if name == "tensorboard" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_tensorboard)
    with pytest.raises(ValueError, match=r"--report-to tensorboard needs the tensorboard package.*pip install"):
        check_options(NodeOptions(report_to="tensorboard"))
    with pytest.raises(ValueError, match="pip install"):
        ExperimentConfig(report_to="tensorboard")


@needs_tensorboard
def test_an_experiment_hands_report_to_to_every_node(tmp_path: Path) -> None:
    cfg = ExperimentConfig(report_to="tensorboard")
    argv = local_command(cfg, plan_runs(cfg)[0], tmp_path)
    assert argv[argv.index("--report-to") + 1] == "tensorboard"
    assert "--report-to" not in local_command(ExperimentConfig(), plan_runs(cfg)[0], tmp_path)


@pytest.mark.process
@pytest.mark.skipif(HAS_WANDB, reason="wandb is installed here")
def test_the_refusal_comes_before_torch_is_imported() -> None:
    argv = ["local", "--report-to", "wandb", "--models", "no-such-model"]  # without the check: the model's refusal
    code = f"import sys; from node.cli.main import main; c = main({argv!r}); "
    code += "print(c, 'torch' in sys.modules, 'hivemind' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["2", "False", "False"], done.stderr
    assert "--report-to wandb needs the wandb package" in done.stderr


@pytest.mark.network
@needs_tensorboard
def test_a_local_swarms_nodes_write_their_scalars_to_tensorboard(procs: Procs) -> None:
    """End to end: every node of ``local --report-to tensorboard`` logs what its metrics.jsonl records."""
    log_dir = procs.root / "runs"
    cmd = [PYTHON, "-m", "node", "local", "--nodes", "2", "--rounds", "3", "--models", "tiny-s", "--no-dashboard"]
    cmd += ["--generations", "4", "--eval-every", "2", "--eval-items", "4", "--eval-samples", "0"]
    cmd += ["--log-dir", str(log_dir), "--report-to", "tensorboard"]
    local = procs.start("local", cmd)
    assert local.wait(180) == 0, local.log_tail()
    metrics = sorted(log_dir.glob("*/metrics.jsonl"))
    assert len(metrics) == 2
    for path in metrics:
        got = _scalars(path.parent / TENSORBOARD_FOLDER)
        for tag, event, key in (("reward/local", "round", "reward_mean"), ("heldout/accuracy", "eval", "accuracy")):
            recorded = [(int(e["round"]), float(e[key])) for e in read_events(path, event)]
            assert [s for s, _ in got[tag]] == [r for r, _ in recorded], tag  # the round is the step
            assert [v for _, v in got[tag]] == pytest.approx([v for _, v in recorded], rel=1e-6), tag  # float32
        assert [s for s, _ in got["heldout/accuracy"]] == [0, 2, 3]
        assert [s for s, _ in got["groups/trained"]] == [1, 2, 3]
        assert set(got) <= set(ROUND_SCALARS.values()) | set(EVAL_SCALARS.values()), json.dumps(sorted(got))
