"""Checkpoint files: round trip, atomic replace keeping the previous one, fallback on a torn file."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest
import torch

from node.core import checkpoint
from node.core.checkpoint import CURRENT, PREVIOUS, CheckpointConfig, CheckpointError


def state(round_: int) -> dict[str, object]:
    rng = random.Random(round_)
    return {"round": round_, "w": torch.full((4,), float(round_)), "rng": rng.getstate(), "opt": {"lr": 0.1}}


def test_round_trip_keeps_previous(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, state(1))
    checkpoint.save(tmp_path, state(2))
    got = checkpoint.load_latest(tmp_path)
    assert got is not None and got[0]["round"] == 2 and got[1].name == CURRENT
    assert torch.equal(got[0]["w"], torch.full((4,), 2.0))
    r = random.Random()
    r.setstate(got[0]["rng"])  # the sampler's RNG state survives the weights-only load
    assert r.random() == random.Random(2).random()
    assert checkpoint.decode((tmp_path / PREVIOUS).read_bytes())["round"] == 1
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty"])
def test_torn_current_falls_back_to_previous(tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    checkpoint.save(tmp_path, state(1))
    checkpoint.save(tmp_path, state(2))
    data = (tmp_path / CURRENT).read_bytes()
    broken = {"truncate": data[: len(data) // 2], "flip": data[:-1] + bytes([data[-1] ^ 1]), "empty": b""}[damage]
    (tmp_path / CURRENT).write_bytes(broken)
    with caplog.at_level(logging.WARNING):
        got = checkpoint.load_latest(tmp_path)
    assert got is not None and got[0]["round"] == 1 and got[1].name == PREVIOUS
    assert "trying the previous one" in caplog.text


def test_crash_between_renames_leaves_the_previous(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, state(1))
    (tmp_path / CURRENT).replace(tmp_path / PREVIOUS)  # as if killed between the two os.replace calls
    got = checkpoint.load_latest(tmp_path)
    assert got is not None and got[0]["round"] == 1


def test_nothing_or_only_garbage(tmp_path: Path) -> None:
    assert checkpoint.load_latest(tmp_path) is None
    (tmp_path / CURRENT).write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="no intact checkpoint"):
        checkpoint.load_latest(tmp_path)


def test_config_validation() -> None:
    assert CheckpointConfig().checkpoint_every == 50
    with pytest.raises(ValueError, match="checkpoint_every=-1; use a value >= 0"):
        CheckpointConfig(checkpoint_every=-1)
