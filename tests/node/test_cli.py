from __future__ import annotations

import subprocess
import sys

import pytest

from node.cli import CliError, build_parser, parse_host_port


def test_host_port_forms() -> None:
    assert parse_host_port(None, "0.0.0.0") == ("0.0.0.0", 0)
    assert parse_host_port("31337", "0.0.0.0") == ("0.0.0.0", 31337)
    assert parse_host_port("127.0.0.1:5000", "0.0.0.0") == ("127.0.0.1", 5000)
    for bad in ("abc", "1.2.3.4:99999", "host:"):
        with pytest.raises(CliError, match="host-port"):
            parse_host_port(bad, "0.0.0.0")


def test_join_requires_a_peer() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["join"])


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "node.cli", *args], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize(
    "args, words",
    [
        (["join", "--peer", "not-a-multiaddr"], "is not a multiaddr"),
        (["join", "--peer", "/ip4/127.0.0.1/tcp/1"], "/p2p/"),
        (["start", "--model", "no-such-model", "--host-port", "127.0.0.1:0"], "no-such-model"),
        (["start", "--task", "no-such-task", "--host-port", "127.0.0.1:0"], "no-such-task"),
        (["start", "--generations", "1", "--host-port", "127.0.0.1:0"], "2-64"),
        (["local", "--nodes", "0"], "--nodes 0"),
    ],
)
def test_bad_input_is_one_sentence_not_a_traceback(args: list[str], words: str, tmp_path: object) -> None:
    res = run_cli(*args, "--identity", f"{tmp_path}/id.key", "--log-dir", f"{tmp_path}/runs")
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    assert words in res.stderr
