"""Bad input at start-up: one sentence naming the fix (exit status 2), before torch or hivemind load, and no
process left behind.

The fast tier walks the list in-process through :func:`node.cli.main.main`; the ``process`` tests run a few
as real commands: that the walk needs neither torch nor hivemind, and that an error found only after the
node's DHT child and p2pd started still ends in one sentence with no process of the run left. How long each
refusal takes is measured by ``bench/bench_startup.py --refusals``, not asserted here.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.cli.errors import CliError
from node.cli.main import _parse, build_parser, main
from node.cli.preflight import start_warnings
from node.core.checkpoint_round import ROUND_FILE, read_round
from node.core.options import NodeOptions
from protocol import SigningKey
from swarm.identity import encode_key_file, load_or_create

ROOT = Path(__file__).resolve().parents[2]
FULL_ID = "12D3KooWJkHwJExtiW3QMDLqmbp3WezDiwHooVFNhWrLwLi3jY5u"


@pytest.fixture
def listening() -> Iterator[int]:
    """A port another program listens on (a socket of this test)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def _key(path: Path, data: bytes, mode: int = 0o600) -> str:
    path.write_bytes(data)
    path.chmod(mode)
    return str(path)


def _checkpoint_at(log_dir: Path, key: Path, round_: int) -> None:
    """A checkpoint of the node with identity ``key`` at ``round_``, as the node leaves it on disk."""
    run_dir = log_dir / load_or_create(key).peer_id[-6:]
    run_dir.mkdir(parents=True)
    (run_dir / "checkpoint.pt").write_bytes(b"not read by the command line")
    (run_dir / ROUND_FILE).write_text(json.dumps({"round": round_}))


def bad_inputs(tmp: Path, busy: int) -> list[tuple[list[str], str]]:
    """(argv, words its one sentence holds) for every kind of bad start-up input found so far."""
    afile, folder, nomodel = tmp / "afile", tmp / "folder", tmp / "empty-model"
    afile.touch()
    folder.mkdir()
    nomodel.mkdir()
    seed = SigningKey.generate()
    valid = encode_key_file(seed)
    corrupt = valid[:36] + bytes(32)  # the seed kept, the public key zeroed
    _checkpoint_at(tmp / "done", tmp / "done.key", 5)
    (tmp / "local-bad" / "keys").mkdir(parents=True)
    _key(tmp / "local-bad" / "keys" / "node1.key", b"garbage")
    peer = ["--peer", f"/ip4/127.0.0.1/tcp/1/p2p/{FULL_ID}"]
    done = ["--identity", str(tmp / "done.key"), "--log-dir", str(tmp / "done")]
    return [
        (["start", "--log-dir", str(afile)], "names a file"),
        (["start", "--log-dir", str(afile / "sub")], f"({afile} is a file)"),
        (["start", "--log-dir", "/proc/swarm-node-nope"], "pass a folder you can write to"),
        (["local", "--log-dir", str(afile)], "names a file"),
        (["start", "--identity", str(folder)], "is a directory; pass a key file path"),
        (["start", "--identity", _key(tmp / "garbage.key", b"garbage")], "not an Ed25519 identity file"),
        (["start", "--identity", _key(tmp / "short.key", valid[:40])], "not an Ed25519 identity file"),
        (["start", "--identity", _key(tmp / "corrupt.key", corrupt)], "is corrupt"),
        (["start", "--identity", _key(tmp / "shared.key", valid, 0o644)], "chmod 600"),
        (["start", "--identity", str(afile / "id.key")], f"({afile} is a file)"),
        (["start", "--host-port", "99999"], "the port must be 0-65535"),
        (["start", "--host-port", "abc"], "is not PORT or HOST:PORT"),
        (["start", "--host-port", f"127.0.0.1:{busy}"], f"port {busy} is in use by another program"),
        (["start", "--host-port", "203.0.113.77:5000"], "is not an address of this machine"),
        (["start", "--dashboard-port", str(busy)], f"port {busy} is in use by another program"),
        (["join", "--peer", f"/ip4/127.0.0.1/tcp/1/p2p/{FULL_ID[:30]}"], "is truncated (30 of 52 characters)"),
        (["join", "--peer", "/ip4/127.0.0.1/tcp/1/p2p/Qm0OIl"], "'Qm0OIl' is not a peer id"),
        (["join", "--peer", "garbage"], "is not a multiaddr"),
        (["join", "--peer", "/ip4/127.0.0.1/tcp/1"], "/p2p/"),
        (["join"], "join needs at least one --peer"),
        (["start", "--model", str(nomodel)], "has no config.json"),
        (["local", "--models", f"tiny-s,{nomodel}"], "has no config.json"),
        (["start", "--model", "no-such-model"], "unknown model"),
        (["start", "--task", "no-such-task"], "--task no-such-task: unknown task family; use one of max,"),
        (["local", "--accept-task", "rg:nope"], "--accept-task rg:nope: unknown task family"),
        (["start", "--rounds", "-3"], "--rounds must be >= 0, got -3"),
        (["local", "--nodes", "0"], "--nodes must be >= 1"),
        (["start", "--round", "1"], "unrecognized arguments: --round"),
        (["join", *peer, "--sync-ev", "2"], "unrecognized arguments: --sync-ev"),
        (["experiment", "--prim", "x"], "unrecognized arguments: --prim"),
        (["eval", "--check", "x"], "unrecognized arguments: --check"),
        (["start", "--client-mode", "--announce", "/ip4/1.2.3.4/tcp/5"], "drop --announce"),
        (["start", *done, "--resume", "--rounds", "5"], "is at round 5"),
        (["local", "--log-dir", str(tmp / "local-bad"), "--nodes", "2"], "node1.key is not an Ed25519 identity"),
    ]


def _one_sentence(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("swarm-node: error: ") and "Traceback" not in err, err
    return lines[0]


def test_every_bad_start_up_input_is_one_sentence_naming_the_fix(
    tmp_path: Path, listening: int, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = bad_inputs(tmp_path, listening)
    for argv, words in cases:
        code = main(argv)
        line = _one_sentence(capsys.readouterr().err)
        assert code == 2 and words in line, (argv, line)
    # the fix is in the sentence: each names a flag or the value to change
    assert len(cases) >= 30


def test_good_input_passes_the_same_checks(tmp_path: Path, listening: int) -> None:
    """A checkpoint short of --rounds, a free port, a full peer id, a folder to be created: no refusal."""
    _checkpoint_at(tmp_path / "runs", tmp_path / "id.key", 5)
    base = ["--identity", str(tmp_path / "id.key"), "--log-dir", str(tmp_path / "runs" / "new" / "deeper")]
    free = ["--host-port", "127.0.0.1:0", "--dashboard-port", "0"]
    args = _parse(build_parser(), ["start", *base, *free, "--resume", "--rounds", "6"])
    assert args.rounds == 6 and not (tmp_path / "runs" / "new").exists()  # checked, not created
    args = _parse(build_parser(), ["join", "--peer", f"/ip4/127.0.0.1/tcp/{listening}/p2p/{FULL_ID}", *base])
    assert args.peer == [f"/ip4/127.0.0.1/tcp/{listening}/p2p/{FULL_ID}"]


def test_version_is_the_package_metadata(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"swarm-node {importlib.metadata.version('swarm-node')}"


def test_sync_every_beside_a_sync_period_says_which_one_decides() -> None:
    both = NodeOptions(sync_every=5, sync_period_s=60)
    (warning,) = start_warnings(both)
    assert warning.startswith("--sync-period 60 decides when to sync") and "drop --sync-every" in warning
    assert start_warnings(NodeOptions(sync_every=5)) == []
    assert start_warnings(NodeOptions(sync_period_s=60)) == []


def test_bf16_sampling_on_a_gpu_says_it_does_nothing() -> None:
    (warning,) = start_warnings(NodeOptions(sample_precision="bfloat16", device="cuda"))
    assert "drop --sample-precision" in warning
    assert start_warnings(NodeOptions(sample_precision="bfloat16", device="cpu")) == []


def test_a_share_threshold_with_the_adaptive_share_off_says_it_does_nothing() -> None:
    (warning,) = start_warnings(NodeOptions(adaptive_share=False, share_threshold=0.5))
    assert warning.startswith("--share-threshold 0.5 sets the adaptive share") and "drop one" in warning
    assert start_warnings(NodeOptions(share_threshold=0.5)) == []
    assert start_warnings(_parse(build_parser(), ["local", "--share-threshold", "0.5", "--no-adaptive-share"]))


def test_resuming_past_rounds_is_refused_alone_and_warned_of_in_a_local_swarm(tmp_path: Path) -> None:
    """A node alone would exit at once; a node of ``local`` (``--hold``) serves its rollouts while slower ones
    catch up, so it starts; ``local`` whose every node is done says so, and still writes its summary."""
    _checkpoint_at(tmp_path / "one", tmp_path / "one.key", 5)
    alone = ["start", "--identity", str(tmp_path / "one.key"), "--log-dir", str(tmp_path / "one"), "--resume"]
    with pytest.raises(CliError, match="is at round 5"):
        _parse(build_parser(), [*alone, "--rounds", "5"])
    assert _parse(build_parser(), [*alone, "--rounds", "5", "--hold"]).hold
    (tmp_path / "swarm" / "keys").mkdir(parents=True)
    for i, done in enumerate((20, 25)):
        _checkpoint_at(tmp_path / "swarm", tmp_path / "swarm" / "keys" / f"node{i}.key", done)
    local = ["local", "--nodes", "2", "--log-dir", str(tmp_path / "swarm"), "--resume"]
    (warning,) = start_warnings(_parse(build_parser(), [*local, "--rounds", "20"]))
    assert "every node's checkpoint" in warning and "raise --rounds above 25" in warning
    assert start_warnings(_parse(build_parser(), [*local, "--rounds", "21"])) == []  # node 0 has rounds to run
    assert start_warnings(_parse(build_parser(), [*local, "--rounds", "20", "--nodes", "3"])) == []  # a new node


def test_a_checkpoint_write_records_its_round_for_the_command_line(tmp_path: Path) -> None:
    import torch

    from node.core import checkpoint

    assert read_round(tmp_path) is None
    checkpoint.save(tmp_path, {"round": 7, "weights": torch.zeros(2)})
    assert read_round(tmp_path) == 7
    checkpoint.save(tmp_path, {"round": 9, "weights": torch.zeros(2)})
    assert read_round(tmp_path) == 9
    (tmp_path / "checkpoint.pt").unlink()  # the round file alone describes no checkpoint
    assert read_round(tmp_path) is None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _run_alone(argv: list[str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``python -m node argv`` in its own process group; fails if any process of that group outlives it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "node", *argv], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
        assert not _group_alive(proc.pid), f"a process of {argv} is still running after it exited"
    finally:
        if _group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@pytest.mark.process
def test_the_refusals_need_neither_torch_nor_hivemind(tmp_path: Path, listening: int) -> None:
    code = (
        "import json, sys\nfrom node.cli.main import main\nfrom tests.node.test_cli_refusals import bad_inputs\n"
        "from pathlib import Path\n"
        f"cases = bad_inputs(Path({str(tmp_path)!r}), {listening})\n"
        "codes = [main(argv) for argv, _ in cases]\n"
        "print(json.dumps([codes, 'torch' in sys.modules, 'hivemind' in sys.modules]))"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    codes, torch_loaded, hivemind_loaded = json.loads(res.stdout.strip().splitlines()[-1])
    assert set(codes) == {2} and not torch_loaded and not hivemind_loaded, res.stderr
    assert "Traceback" not in res.stderr and all(ln.startswith("swarm-node: error: ") for ln in res.stderr.splitlines())


@pytest.mark.process
def test_a_log_dir_naming_a_file_is_refused_at_once_leaving_no_process(tmp_path: Path) -> None:
    (tmp_path / "afile").touch()
    res = _run_alone(
        ["start", "--log-dir", str(tmp_path / "afile"), "--identity", str(tmp_path / "k"), "--rounds", "1"]
    )
    assert res.returncode == 2
    assert _one_sentence(res.stderr).endswith("pass a folder (it is created if missing)")


@pytest.mark.process
def test_an_error_after_the_dht_started_stops_it_and_is_one_sentence(tmp_path: Path) -> None:
    """The node's own folder, ``<log-dir>/<peer-short-id>``, is a file: found only when the node opens its
    metrics, after its DHT child and p2pd are up; both must go, or they keep the process alive."""
    key = tmp_path / "id.key"
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / load_or_create(key).peer_id[-6:]).touch()
    argv = ["start", "--identity", str(key), "--log-dir", str(tmp_path / "runs"), "--rounds", "1"]
    res = _run_alone([*argv, "--host-port", "127.0.0.1:0", "--model", "tiny-s"])
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("swarm-node: error: ")]
    assert res.returncode == 2 and len(errors) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "check --log-dir" in errors[0], errors
