from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.cli.errors import CliError
from node.cli.main import main, parse_host_port


def test_host_port_forms() -> None:
    assert parse_host_port(None, "0.0.0.0") == ("0.0.0.0", 0)
    assert parse_host_port("31337", "0.0.0.0") == ("0.0.0.0", 31337)
    assert parse_host_port("127.0.0.1:5000", "0.0.0.0") == ("127.0.0.1", 5000)
    for bad in ("abc", "1.2.3.4:99999", "host:"):
        with pytest.raises(CliError, match="host-port"):
            parse_host_port(bad, "0.0.0.0")


def test_join_requires_a_peer(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["join"]) == 2  # a peer may also come from --config, so argparse does not require the flag
    assert "join needs at least one --peer" in capsys.readouterr().err


@pytest.fixture
def keep_signal_handlers() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


@pytest.mark.usefixtures("keep_signal_handlers")
@pytest.mark.parametrize(
    "args, words",
    [
        (["join", "--peer", "not-a-multiaddr"], "is not a multiaddr"),
        (["join", "--peer", "/ip4/127.0.0.1/tcp/1"], "/p2p/"),
        (["start", "--model", "no-such-model"], "no-such-model"),
        (["start", "--task", "no-such-task"], "no-such-task"),
        (["start", "--generations", "1"], "2-64"),
        (["start", "--host-port", "x:y"], "--host-port"),
        (["local", "--nodes", "0"], "--nodes 0"),
        (["local", "--nodes", "2", "--isolated", "3"], "--isolated 3"),
    ],
)
def test_bad_input_is_one_sentence(
    args: list[str], words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([*args, "--identity", f"{tmp_path}/id.key", "--log-dir", f"{tmp_path}/runs"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("swarm-node: error: ") and words in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.process
def test_real_invocation_prints_no_traceback(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "node", "join", "--peer", "/ip4/127.0.0.1/tcp/1", "--identity", f"{tmp_path}/k"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and "/p2p/" in res.stderr
