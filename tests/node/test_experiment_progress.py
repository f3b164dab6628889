"""The sweep's progress display: a finished run is one plain line, without rich's time and source link."""

from __future__ import annotations

import io

from node.experiments.progress import SweepProgress


def test_a_finished_run_prints_one_plain_line() -> None:
    out = io.StringIO()
    progress = SweepProgress(10, enabled=True)
    with progress:
        assert progress._progress is not None
        progress._progress.console.file = out
        progress.start_run("runs/a", 5)
        progress.finished_run("runs/a", 5, skipped=False)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("runs/a:")]
    assert lines == ["runs/a: ended"], out.getvalue()  # console.log would add "progress.py:NN" and the time
