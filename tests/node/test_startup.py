"""A tiny-model node joins the swarm (listens) before it imports transformers or any other heavy library
it does not need then: the model's imports take seconds, and the node is reachable meanwhile."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.process
def test_a_tiny_model_node_joins_before_importing_transformers(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "tests.startup_probe", "tiny-m", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    seen = json.loads(res.stdout.strip().splitlines()[-1])
    assert seen["joining"] == [], seen
    assert "transformers" in seen["started"], seen  # the probe sees the model's imports
