"""The failed-dial judge of chaos runs: a donor running, frozen (silent) or gone at a failed dial's time."""

from __future__ import annotations

from pathlib import Path

from bench.chaos_dials import DonorState, Failure, classify, main, parse_log, read_run, tally

DIAL = "W [aaaaaa rev=7] state download from bbbbbb failed: Connect failed. msg=failed to dial: all dials failed"


def _round(t: str, peer: str) -> str:
    return f"{t} I [{peer} r=3] reward 0.000 | groups 2 local + 0 external | 0.03s"


def test_parse_log_reads_own_id_line_times_and_failed_dials() -> None:
    lines = [
        "swarm-node: peer 12D3... is up at round 0; listening on:",
        _round("10:00:00", "aaaaaa"),
        f"10:00:01 {DIAL}",
        "  * [/ip4/127.0.0.1/tcp/44905] dial backoff",
        "10:00:02 W [aaaaaa rev=7] catch-up failed (no donor served the target state); retrying next round",
    ]
    me, times, failures = parse_log(lines)
    assert me == "aaaaaa"
    assert times == [36000.0, 36001.0, 36002.0]
    assert failures == [Failure(36001.0, "aaaaaa", "bbbbbb")]


def test_classify_running_silent_gone() -> None:
    proc = [100.0, 100.5, 101.0, 101.5, 110.0, 110.5]  # rounds, then a 8.5 s gap (frozen), then rounds
    assert classify(101.2, [proc]) is DonorState.RUNNING
    assert classify(105.0, [proc]) is DonorState.SILENT
    assert classify(99.0, [proc]) is DonorState.GONE
    assert classify(120.0, [proc]) is DonorState.GONE
    assert classify(105.0, [proc, [104.0, 104.5, 105.5]]) is DonorState.RUNNING  # a restarted process
    assert classify(1.0, []) is DonorState.GONE


def test_tally_and_main_read_a_run(tmp_path: Path, capsys: object) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "n0.1.log").write_text(
        "\n".join([_round("10:00:00", "aaaaaa"), f"10:00:05 {DIAL}", f"10:00:20 {DIAL}", f"10:00:40 {DIAL}"]) + "\n"
    )
    # the donor: running 10:00:00-10:00:06, frozen until 10:00:30, running to 10:00:31, then gone
    donor = [_round(f"10:00:{s:02d}", "bbbbbb") for s in (0, 1, 2, 3, 4, 5, 6, 30, 31)]
    (logs / "n1.1.log").write_text("\n".join(donor) + "\n")
    failures, processes = read_run(tmp_path)
    assert len(failures) == 3 and set(processes) == {"aaaaaa", "bbbbbb"}
    counts = tally(failures, processes)
    assert counts == {DonorState.RUNNING: 1, DonorState.SILENT: 1, DonorState.GONE: 1}
    assert main([str(tmp_path)]) == 0
    assert "3 failed dials; donor running 1, silent 1, gone 1" in capsys.readouterr().out  # type: ignore[attr-defined]
