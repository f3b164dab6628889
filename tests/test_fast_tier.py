"""The fast tier's rule (tests/conftest.py): only tests marked ``process`` may start a process."""

from __future__ import annotations

import multiprocessing
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import UnmarkedProcessStart


def test_an_unmarked_test_cannot_start_a_process() -> None:
    with pytest.raises(UnmarkedProcessStart, match=re.escape("mark it @pytest.mark.process")):
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    with pytest.raises(UnmarkedProcessStart):
        multiprocessing.get_context("spawn").Process(target=print).start()
    with pytest.raises(UnmarkedProcessStart):
        os.fork()


@pytest.mark.process
def test_a_marked_test_can() -> None:
    assert subprocess.run([sys.executable, "-c", "pass"], check=True).returncode == 0
