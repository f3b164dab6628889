"""Every component config refuses a value its field's declaration refuses: the declaration is the one check."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from node.core.configs import CheckpointConfig, IngestConfig, NodeConfig
from node.training.configs import AdapterConfig, EvalConfig, GenerationConfig, GRPOConfig
from swarm.configs import MembershipConfig, OuterSyncConfig
from swarm.declared import broken_rule, declared_problem

CONFIGS: tuple[type[Any], ...] = (
    NodeConfig, CheckpointConfig, IngestConfig, GRPOConfig, GenerationConfig, AdapterConfig, EvalConfig,
    OuterSyncConfig, MembershipConfig,
)  # fmt: skip
SKIPPED = {("OuterSyncConfig", "allreduce_timeout_s")}
"""Declared ranges that are the command line's, not the component's (see OuterSyncConfig.__post_init__)."""


def _outside(f: dataclasses.Field[Any]) -> list[Any]:
    """Values just outside ``f``'s declared range or choices (of the field's kind)."""
    meta, step = f.metadata, 1 if isinstance(f.default, int) else 0.5
    if meta.get("choices"):
        return ["not-a-choice"]
    values = [meta["min"] - step] if meta.get("min") is not None else []
    values += [meta["max"] + step] if meta.get("max") is not None else []
    values += [meta[k] for k in ("above", "below") if meta.get(k) is not None]  # an exclusive bound itself
    return [v for v in values if not (meta.get("or_zero") and v == 0)]


def _declared_fields() -> list[tuple[type[Any], dataclasses.Field[Any]]]:
    out = []
    for cls in CONFIGS:
        for f in dataclasses.fields(cls):
            ranged = any(f.metadata.get(k) is not None for k in ("min", "max", "above", "below"))
            if (ranged or f.metadata.get("choices")) and (cls.__name__, f.name) not in SKIPPED:
                out.append((cls, f))
    return out


def test_every_declared_range_and_choice_is_what_its_config_checks() -> None:
    fields = _declared_fields()
    assert len(fields) >= 35  # the walk is not vacuous
    for cls, f in fields:
        outside = _outside(f)
        assert outside, (cls.__name__, f.name)
        for value in outside:
            with pytest.raises(ValueError, match=rf"^{cls.__name__}\.{f.name}={value!r}; use "):
                cls(**{f.name: value})
        cls(**{f.name: f.default})  # the default lies inside


def test_a_bool_or_text_is_not_a_number_to_a_ranged_field() -> None:
    with pytest.raises(ValueError, match=r"GenerationConfig.max_new_tokens=True; use a number"):
        GenerationConfig(max_new_tokens=True)
    with pytest.raises(ValueError, match=r"AdapterConfig.lora_rank='8'; use a number"):
        AdapterConfig(lora_rank="8")  # type: ignore[arg-type]


def test_the_skipped_range_is_the_command_lines_floor() -> None:
    # a component of faster DHT bounds syncs within less than the command line's 5 s floor
    fast = OuterSyncConfig(allreduce_timeout_s=2.0, dht_timeout_s=1.0)
    assert declared_problem(fast, skip=("allreduce_timeout_s",)) is None
    assert declared_problem(fast) == "OuterSyncConfig.allreduce_timeout_s=2.0; use a value >= 5"
    assert declared_problem(OuterSyncConfig(sync_period_s=1)) is None
    with pytest.raises(ValueError, match=r"^OuterSyncConfig.sync_period_s=0.5; use 0 or a value >= 1$"):
        OuterSyncConfig(sync_period_s=0.5)
    with pytest.raises(ValueError, match=r"^OuterSyncConfig.outer_momentum=1.0; use a value in \[0, 1\)$"):
        OuterSyncConfig(outer_momentum=1.0)
    with pytest.raises(ValueError, match=r"^NodeConfig.max_source_share=0; use a value in \(0, 16\]$"):
        NodeConfig(max_source_share=0)


@pytest.mark.parametrize(
    ("meta", "value", "rule"),
    [
        ({"min": 1, "or_zero": True}, 0.5, "0 or >= 1"),
        ({"min": 1, "or_zero": True}, 0, None),
        ({"above": 0, "below": 1}, 1.0, "> 0 and < 1"),
        ({"min": 0, "max": 64}, float("nan"), ">= 0 and <= 64"),
        ({"min": 0}, None, None),  # a range says nothing of an unset value
        ({}, -5, None),
    ],
)
def test_broken_rule_words_the_range(meta: dict[str, Any], value: Any, rule: str | None) -> None:
    assert broken_rule(meta, value) == rule
