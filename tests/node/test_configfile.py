"""Config files and the small commands: init, id, flags over file, one-sentence errors."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from node.cli.errors import CliError
from node.cli.main import _parse, build_parser, main


def parse(argv: list[str]) -> object:
    return _parse(build_parser(), argv)


def test_init_writes_a_commented_file_that_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "node.toml"
    assert main(["init", str(path)]) == 0
    text = path.read_text()
    assert tomllib.loads(text) == {}, "every key is commented out"
    for key in ("max-threads", "checkpoint-every", "announce", "client-mode", "nodes", "peer"):
        assert f"# {key} = " in text
    for key in ("dashboard-port", "lr", "external-min-logp", "host-port"):  # no value means "off" or "derived"
        assert f"# {key}: unset by default" in text and f"# {key} = " not in text
    # uncommenting any line gives a valid file
    uncommented = "\n".join(line[2:] for line in text.splitlines() if " = " in line and line.startswith("# "))
    data = tomllib.loads(uncommented)
    assert data["max-threads"] == 0 and data["resume"] is False
    assert main(["init", str(path)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["init", str(path), "--force"]) == 0


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('rounds = 7\nmax_threads = 2\ntask = ["max", "min"]\ndashboard-port = 9000\nclient-mode = true\n')
    args = parse(["start", "--config", str(path)])
    assert (args.rounds, args.max_threads, args.tasks, args.dashboard_port, args.client_mode) == (  # type: ignore[attr-defined]
        7, 2, ["max", "min"], 9000, True,
    )  # fmt: skip
    args = parse(["start", "--config", str(path), "--rounds", "3", "--task", "pos"])
    assert (args.rounds, args.max_threads, args.tasks) == (3, 2, ["pos"])  # type: ignore[attr-defined]


def test_local_keys_are_allowed_and_join_peer_can_come_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    # a whole peer id: a cut one is refused
    peer = "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWJkHwJExtiW3QMDLqmbp3WezDiwHooVFNhWrLwLi3jY5u"
    path.write_text(f'nodes = 3\npeer = "{peer}"\n')
    assert parse(["start", "--config", str(path)]).command == "start"  # type: ignore[attr-defined]
    assert parse(["local", "--config", str(path)]).nodes == 3  # type: ignore[attr-defined]
    assert parse(["join", "--config", str(path)]).peer == [peer]  # type: ignore[attr-defined]
    with pytest.raises(CliError, match="join needs at least one --peer"):
        parse(["join"])


@pytest.mark.parametrize(
    "content, words",
    [
        ("roundz = 3", "unknown key 'roundz' (did you mean 'rounds'?); valid keys are: "),
        ("rounds = 'many'", "rounds = 'many' must be a whole number"),
        ("resume = 1", "must be true or false"),
        ("task = [1, 2]", "list of strings"),
        ("[rounds]\nx = 3", "not a table"),
        ("rounds = ", "not valid TOML"),
    ],
)
def test_bad_files_are_one_sentence(
    tmp_path: Path, content: str, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(content + "\n")
    assert main(["start", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("swarm-node: error: config file") and words in err, err
    assert len(err.strip().splitlines()) == 1
    if "unknown key" in words:
        assert "rounds" in err and "max-threads" in err


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["start", "--config", str(tmp_path / "nope.toml")]) == 2
    assert "swarm-node init" in capsys.readouterr().err


def test_id_prints_the_peer_id_and_addresses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "id.key"
    assert main(["id", "--identity", str(key)]) == 0
    peer = capsys.readouterr().out.splitlines()[0]
    assert peer.startswith("12D3KooW") and key.exists()
    conf = tmp_path / "c.toml"
    conf.write_text(f'identity = "{key}"\nhost-port = "127.0.0.1:31337"\n')
    assert main(["id", "--config", str(conf)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == peer and f"  /ip4/127.0.0.1/tcp/31337/p2p/{peer}" in out
    assert main(["id", "--identity", str(key), "--host-port", "31337"]) == 0
    assert f"/ip4/127.0.0.1/tcp/31337/p2p/{peer}" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["start", "local"])
def test_the_init_file_uncommented_gives_back_every_default(tmp_path: Path, command: str) -> None:
    """Every value ``init`` shows is the real default: the file with every value uncommented changes nothing."""
    path = tmp_path / "node.toml"
    assert main(["init", str(path)]) == 0
    lines = path.read_text().splitlines()
    uncommented = tmp_path / "all.toml"
    values = [line[2:] for line in lines if line.startswith("# ") and " = " in line]
    if command == "local":  # start's rounds = 0 (run until stopped) is out of a local run's range: it must end
        values.remove("rounds = 0")
    uncommented.write_text("\n".join(values) + "\n")
    plain = vars(parse([command]))
    loaded = vars(parse([command, "--config", str(uncommented)]))
    loaded.pop("config")
    plain.pop("config")
    differ = {k: (plain[k], v) for k, v in loaded.items() if plain.get(k) != v}
    if command == "start":
        assert differ == {}
    else:  # one file serves every command: a key whose local default differs says so beside its line
        assert set(differ) == {"log_dir"}, differ
        text = path.read_text()
        assert "(default for swarm-node local: 20)" in text and '(default for swarm-node local: "runs/local")' in text


def test_unreadable_config_and_identity_paths_are_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"rounds = 3\n\xff\xfe\n")
    cases = [
        (["start", "--config", str(tmp_path)], "is a directory"),
        (["start", "--config", str(binary)], "not UTF-8"),
        (["id", "--identity", str(tmp_path)], "is a directory"),
    ]
    for argv, words in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1, err


def test_id_with_a_bad_address_creates_no_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "new.key"
    assert main(["id", "--identity", str(key), "--host-port", "abc"]) == 2
    assert "--host-port" in capsys.readouterr().err
    assert not key.exists()
