from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
import time
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from node.cli.errors import CliError
from node.cli.flags import _scalar_type
from node.cli.main import main, parse_host_port
from node.core.options import JoinOptions, LocalOptions, NodeOptions, flag_of, option_fields
from node.experiments.config import ExperimentConfig


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
        (["start", "--generations", "1"], "--generations must be >= 2 and <= 64, got 1"),
        (["start", "--host-port", "x:y"], "--host-port"),
        (["local", "--nodes", "0"], "--nodes must be >= 1 and <= 64, got 0"),
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


def _out_of_range(meta: Any, kind: Any) -> float:
    """A value just outside an option's range (its lower side where it has one)."""
    if meta["above"] is not None:
        return float(meta["above"])
    if meta["min"] is not None:
        if kind is int:  # below an int's 0-or-at-least-min range is a negative number
            return -1 if meta["or_zero"] else meta["min"] - 1
        return meta["min"] - 0.5  # type: ignore[no-any-return]
    if meta["below"] is not None:
        return float(meta["below"])
    return meta["max"] + 1  # type: ignore[no-any-return]


def _ranged(cls: type[Any]) -> list[tuple[str, str]]:
    """(flag, out-of-range value) for every field of ``cls`` (options or ``ExperimentConfig``) with a range."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if any(f.metadata.get(k) is not None for k in ("min", "max", "above", "below")):
            kind = _scalar_type(hints[f.name])
            value = _out_of_range(f.metadata, kind)
            out.append((flag_of(f), str(int(value)) if kind is int else f"{value:g}"))
    return out


COMMANDS: dict[str, tuple[type[Any], int]] = {
    "start": (NodeOptions, 30), "join": (JoinOptions, 30), "local": (LocalOptions, 30),
    "experiment": (ExperimentConfig, 15),
}  # fmt: skip
"""Each command's options and how many of them at least have a range (so the walk is not vacuous)."""


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_out_of_range_option_is_one_sentence_naming_its_flag(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cls, ranged = COMMANDS[command]
    peer = ["--peer", "/ip4/127.0.0.1/tcp/1"] if command == "join" else []
    cases = _ranged(cls)
    assert len(cases) >= ranged
    for flag, value in cases:
        t0 = time.monotonic()
        code = main([command, *peer, flag, value])
        took = time.monotonic() - t0
        err = capsys.readouterr().err
        assert code == 2, (flag, value, err)
        assert err.startswith(f"swarm-node: error: {flag} must be ") and f"got {value}" in err, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
        assert took < 1.0, f"{flag}: {took:.2f}s"


def test_a_config_file_value_out_of_range_names_its_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.toml"
    path.write_text("eval-items = 0\n")
    assert main(["start", "--config", str(path)]) == 2
    assert capsys.readouterr().err.strip() == "swarm-node: error: --eval-items must be >= 1 and <= 4096, got 0"


def test_option_ranges_match_what_the_components_need() -> None:
    from swarm.sync import OuterSyncConfig

    timeout = next(f for f in option_fields(NodeOptions) if f.name == "allreduce_timeout_s")
    assert timeout.metadata["min"] == OuterSyncConfig.dht_timeout_s


@pytest.mark.process
def test_bad_ranges_fail_fast_before_torch_is_imported() -> None:
    code = (
        "import sys, time\nfrom node.cli.main import main\n"
        "bad = (['start', '--rounds', '-5'], ['local', '--nodes', '0'], ['start', '--sync-period', '0.5'],\n"
        "       ['join', '--peer', '/ip4/127.0.0.1/tcp/1', '--eval-timeout', '0'], ['start', '--model', 'nope'],\n"
        "       ['join', '--peer', 'garbage'], ['join', '--peer', '/ip4/127.0.0.1/tcp/1'],\n"
        "       ['local', '--models', 'x'])\n"
        "t0 = time.monotonic()\ncodes = [main(a) for a in bad]\n"
        "print(codes, 'torch' in sys.modules, time.monotonic() - t0 < 1.0)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert res.stdout.strip() == "[2, 2, 2, 2, 2, 2, 2, 2] False True", res.stderr  # neither torch nor hivemind
    lines = res.stderr.strip().splitlines()
    assert lines[0] == "swarm-node: error: --rounds must be >= 0, got -5" and len(lines) == 8
    assert "--model nope: unknown model" in lines[4] and "is not a multiaddr" in lines[5] and "/p2p/" in lines[6]
    assert "Traceback" not in res.stderr
