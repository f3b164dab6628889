"""The CSV files an experiment writes beside ``results.json``: the same numbers, read back and compared."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from node.experiments.config import ExperimentConfig
from node.experiments.csvfiles import LONG_COLUMNS, METRICS, csv_text, label_parts
from node.experiments.results import ONE_SEED_WARNING, NodeResult, RunResult
from node.experiments.sweep import Run, write_outputs


def _node(peer: str, curve: list[float], heldout: list[tuple[int, float]], ext: int = 0) -> NodeResult:
    diag: dict[str, list[float | None]] = {"grad_cos": [None, 0.25, 0.5][: len(curve)]} if ext else {}
    return NodeResult(
        peer=peer, model="tiny-s", curve=tuple(curve), external_groups=ext, trained_groups=len(curve),
        fetch_failed=1, rejected=2, round_s=0.125, diagnostic_curves=diag, heldout=tuple(heldout),
        heldout_reward=tuple((r, a / 2) for r, a in heldout), cpu_s=3.5, eval_items=16,
    )  # fmt: skip


def _results(seeds: tuple[int, ...]) -> list[RunResult]:
    runs = []
    for seed in seeds:
        shift = seed / 1000
        for split, ext, label in (("8/0", 0, "advantage"), ("4/4", 4, "advantage"), ("4/4", 4, "advantage+tis")):
            curves = [[0.1 + shift, (i + 1) / 7, 0.3 + ext / 9] for i in range(2)]  # digits a rounding would lose
            heldout = [[(0, 0.1), (3, 0.2 + ext / 20 + i)] for i in range(2)]
            nodes = tuple(_node(f"{p}{seed}", curves[i], heldout[i], ext) for i, p in enumerate(("aaaaaa", "bbbbbb")))
            runs.append(RunResult(label, split, seed, nodes, wall_s=12.5))
    return runs


def _write(tmp_path: Path, seeds: tuple[int, ...]) -> dict[str, Any]:
    cfg = ExperimentConfig(splits=("8/0", "4/4"), seeds=len(seeds), objectives=("plain", "tis"), nodes=2, rounds=3)
    write_outputs(cfg, _results(seeds), tmp_path, plots=False)
    return dict(json.loads((tmp_path / "results.json").read_text()))


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _num(cell: str) -> float | None:
    return None if cell == "" else float(cell)


def test_the_long_csv_holds_every_value_of_results_json(tmp_path: Path) -> None:
    data = _write(tmp_path, (0, 100))
    rows = _rows(tmp_path / "results.csv")
    assert list(rows[0]) == list(LONG_COLUMNS)
    assert {r["metric"] for r in rows} <= set(METRICS), "every metric written is documented"
    by_key = {(r["run"], r["node"], r["round"], r["metric"]): r["value"] for r in rows}
    assert len(by_key) == len(rows), "one row per (run, node, round, metric)"
    for run in data["runs"]:
        local, external = run["split"].split("/")
        name = Run(label_parts(run["sampling"])["sampling"], int(local), int(external), run["seed"],
                   label_parts(run["sampling"])["objective"]).name  # fmt: skip
        assert float(by_key[(name, "", "", "cumulative_reward")]) == run["cumulative"]
        assert float(by_key[(name, "", "", "wall_s")]) == run["wall_s"]
        for n in run["nodes"]:
            for i, value in enumerate(n["curve"], 1):
                assert float(by_key[(name, n["peer"], str(i), "reward")]) == value  # full precision
            for rnd, acc in n["heldout"]:
                assert float(by_key[(name, n["peer"], str(rnd), "heldout_accuracy")]) == acc
            for rnd, rew in n["heldout_reward"]:
                assert float(by_key[(name, n["peer"], str(rnd), "heldout_sample_reward")]) == rew
            for i, value in enumerate(n["diagnostic_curves"].get("grad_cos", []), 1):
                assert by_key.get((name, n["peer"], str(i), "grad_cos")) == (None if value is None else repr(value))
            assert float(by_key[(name, n["peer"], "", "cumulative_reward")]) == n["cumulative"]
            assert float(by_key[(name, n["peer"], "", "cpu_s")]) == n["cpu_s"]
    tis = next(r for r in rows if r["label"] == "advantage+tis")
    assert (tis["sampling"], tis["objective"], tis["sync"], tis["model"]) == ("advantage", "tis", "", "tiny-s")


def test_the_summary_csvs_are_the_printed_tables_rows(tmp_path: Path) -> None:
    data = _write(tmp_path, (0, 100))
    summary = _rows(tmp_path / "summary.csv")
    shown = {(s["sampling"], s["split"]): s for s in data["summary"]}  # the J = 0 row once, under the first label
    assert [(r["label"], r["split"]) for r in summary] == [("advantage", "8/0"), ("advantage", "4/4"),
                                                          ("advantage+tis", "4/4")]  # fmt: skip
    for r in summary:
        s = shown[(r["label"], r["split"])]
        assert int(r["n"]) == s["seeds"] == 2
        assert _num(r["cumulative_mean"]) == s["cumulative_mean"] and _num(r["cumulative_std"]) == s["cumulative_std"]
        assert _num(r["ratio_vs_no_sharing"]) == s["ratio"] and r["equal_compute"] == "True"
    heldout = _rows(tmp_path / "heldout.csv")
    assert [(r["label"], r["split"], r["n"]) for r in heldout] == [
        (h["label"], h["split"], "2") for h in data["heldout"]
    ]
    for r, h in zip(heldout, data["heldout"], strict=True):
        assert _num(r["final_mean"]) == h["final"] and _num(r["mean_ratio"]) == h["mean_ratio"]
    paired = _rows(tmp_path / "paired.csv")
    expected = [(t["sampling"], t["split"], str(seed), ratio) for t in data["paired"] for seed, ratio in
                zip(t["seeds"], t["ratios"], strict=True)]  # fmt: skip
    assert [(r["label"], r["split"], r["seed"], float(r["ratio"])) for r in paired] == expected
    assert len(paired) == 4  # two policies against 8/0, two seeds each


def test_one_seed_leaves_the_spread_empty_and_results_md_warns(tmp_path: Path) -> None:
    _write(tmp_path, (0,))
    summary = _rows(tmp_path / "summary.csv")
    assert {r["n"] for r in summary} == {"1"} and {r["cumulative_std"] for r in summary} == {""}
    text = (tmp_path / "results.md").read_text()
    assert ONE_SEED_WARNING in text and "(n=1, no spread)" in text and "± 0.00" not in text
    assert "SAPO paper reports" in text and "| SAPO" not in text
    (tmp_path / "two").mkdir()
    _write(tmp_path / "two", (0, 100))
    assert ONE_SEED_WARNING not in (tmp_path / "two" / "results.md").read_text()


def test_csv_cells_keep_every_digit_and_leave_none_empty() -> None:
    text = csv_text(("a", "b", "c"), [{"a": 0.1 + 0.2, "b": None, "c": "x,y"}])
    assert text == 'a,b,c\n0.30000000000000004,,"x,y"\n'
    assert label_parts("credit+sync60s") == {"sampling": "credit", "objective": "plain", "sync": "sync60s"}


@pytest.mark.parametrize("label", ["advantage", "uniform+filter", "advantage+baseline+guide+sync10"])
def test_label_parts_rebuild_the_runs_label(label: str) -> None:
    from node.experiments.sweep import sync_suffix

    parts = label_parts(label)
    h = int(parts["sync"].removeprefix("sync") or 0)
    assert Run(parts["sampling"], 4, 4, 0, parts["objective"], h).label == label
    assert sync_suffix(h) == ("+" + parts["sync"] if h else "")
