from __future__ import annotations

import json
import random
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from node.core.config import NodeConfig
from node.core.pool import ExternalPool, choose
from node.observe.metrics import MetricsWriter, read_events


def g(*rewards: float) -> SimpleNamespace:
    return SimpleNamespace(rewards=rewards)


def test_uniform_choice_is_bounded_and_deterministic() -> None:
    pool = [g(float(i % 2), 0.0) for i in range(10)]
    a = choose(pool, 4, "uniform", random.Random(1))
    assert len(a) == 4 and len(set(a)) == 4
    assert a == choose(pool, 4, "uniform", random.Random(1))
    assert choose(pool, 50, "uniform", random.Random(1)) == list(range(10))


def test_advantage_prefers_informative_groups() -> None:
    pool = [g(1.0, 1.0), g(0.0, 0.0), g(0.0, 1.0), g(1.0, 0.0), g(0.0, 0.0)]
    assert choose(pool, 2, "advantage", random.Random(0)) == [2, 3]
    # with fewer informative groups than asked, the rest are filled from the others
    assert set(choose(pool, 3, "advantage", random.Random(0))) >= {2, 3}


def test_pool_uses_each_group_once_and_drops_oldest() -> None:
    pool: ExternalPool[SimpleNamespace] = ExternalPool(capacity=3)
    items = [g(float(i), 0.0) for i in range(5)]
    pool.add(items)
    assert len(pool) == 3  # the two oldest fell out
    taken = pool.take(2, "uniform", random.Random(0))
    assert len(taken) == 2 and all(t in items[2:] for t in taken)
    rest = pool.take(5, "uniform", random.Random(0))
    assert len(rest) == 1 and rest[0] not in taken
    assert len(pool) == 0


def test_one_source_gets_its_quota_of_rows_and_its_other_groups_wait() -> None:
    def sg(source: str, n: int) -> SimpleNamespace:
        return SimpleNamespace(rewards=(0.0, 1.0) * (n // 2), source_peer=source, completions=("c",) * n)

    pool: ExternalPool[SimpleNamespace] = ExternalPool(capacity=16)
    loud, quiet = [sg("loud", 4) for _ in range(6)], [sg("quiet", 4), sg("other", 4)]
    pool.add(loud + quiet)
    taken = pool.take(4, "uniform", random.Random(0), quota=8)
    assert sum(t.source_peer == "loud" for t in taken) == 2  # 8 rows of its 24
    assert {t.source_peer for t in taken} == {"loud", "quiet", "other"} and len(taken) == 4
    assert len(pool) == 4  # the loud source's other groups stay for later steps
    assert [t.source_peer for t in pool.take(4, "uniform", random.Random(0), quota=8)] == ["loud"] * 2


def test_unknown_policy_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="uniform"):
        choose([], 1, "best", random.Random(0))


def test_metrics_are_json_lines_and_torn_lines_are_skipped(tmp_path: Path) -> None:
    w = MetricsWriter(tmp_path / "p" / "metrics.jsonl")
    w.write("round", round=1, reward_mean=0.5, loss=float("nan"))
    w.write("sync", revision=1)
    w.close()
    with open(tmp_path / "p" / "metrics.jsonl", "a") as f:
        f.write('{"event": "round", "rou')  # a crash mid-write
    rounds = list(read_events(tmp_path / "p" / "metrics.jsonl", "round"))
    assert rounds == [{"event": "round", "round": 1, "reward_mean": 0.5, "loss": None}]
    for line in (tmp_path / "p" / "metrics.jsonl").read_text().splitlines()[:2]:
        json.loads(line)  # strict JSON (no NaN)
    assert list(read_events(tmp_path / "missing.jsonl")) == []


@pytest.mark.parametrize(
    "kwargs, fix",
    [
        ({"num_generations": 1}, "num_generations=1; use a value in [2, 64]"),
        ({"external_groups": -1}, "external_groups=-1; use a value >= 0"),
        ({"sampling": "greedy"}, "uniform"),
        ({"device": "tpu"}, "cpu"),
        ({"rounds": -3}, "rounds=-3; use a value >= 0"),
    ],
)
def test_config_errors_name_the_value_and_fix(kwargs: dict, fix: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match=re.escape(fix)):
        NodeConfig(**kwargs)


def test_a_source_share_below_one_group_is_refused_naming_the_least_that_works() -> None:
    with pytest.raises(ValueError, match="1/4"):
        NodeConfig(local_groups=4, max_source_share=0.2)  # 0.2 x 4 x G < G: no peer group would ever fit
    assert NodeConfig(local_groups=4, max_source_share=0.25).max_source_share == 0.25
