"""The one option-file loader, as a node's ``--config`` and ``experiment``'s ``--config`` use it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from node.cli.experiment import config_from_args
from node.cli.main import _parse, build_parser, main
from node.core.optionfile import FileKey, OptionFileError, load_option_file
from node.experiments.config import ExperimentConfig, load_config_file

KEYS = {
    "rounds": FileKey("rounds", int),
    "lr": FileKey("learning_rate", float, optional=True),
    "sampling": FileKey("sampling", str, choices=("uniform", "advantage")),
    "task": FileKey("tasks", str, many="repeat"),
    "sync-every": FileKey("sync_every", int, many="csv"),
    "resume": FileKey("resume", bool),
}


def _write(tmp_path: Path, text: str, name: str = "c.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_good_file_gives_each_value_by_option_name_and_kind(tmp_path: Path) -> None:
    path = _write(
        tmp_path, 'rounds = 3\nlr = 1\nsampling = "uniform"\ntask = "max"\nsync_every = "0, 10"\nresume = true\n'
    )
    values = load_option_file(path, KEYS, missing_hint="")
    assert values == {
        "rounds": 3, "learning_rate": 1.0, "sampling": "uniform", "tasks": ["max"], "sync_every": (0, 10),
        "resume": True,
    }  # fmt: skip
    assert isinstance(values["learning_rate"], float)
    json_path = _write(tmp_path, json.dumps({"sync-every": [0, 5], "lr": None}), "c.json")
    assert load_option_file(json_path, KEYS, missing_hint="") == {"sync_every": (0, 5), "learning_rate": None}


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (
            "rounds = 3\nsampling = uniform\n",
            "is not valid TOML at line 2 (invalid value); write one key = value a line",
        ),
        ("rounds = 3\nrounds = 4\n", "is not valid TOML at line 2 (cannot overwrite a value)"),
        ('model = "tiny', "is not valid TOML at its end (unterminated string)"),
        ("roundz = 3\n", "unknown key 'roundz' (did you mean 'rounds'?); valid keys are: lr, resume, rounds,"),
        ("colour = 3\n", "unknown key 'colour'; valid keys are: lr, resume, rounds, sampling, sync-every, task"),
        ("rounds = 2.5\n", "rounds = 2.5 must be a whole number"),
        ("lr = 'fast'\n", "lr = 'fast' must be a number"),
        ("resume = 1\n", "resume = 1 must be true or false"),
        ('sampling = "greedy"\n', "sampling = 'greedy' must be one of uniform, advantage"),
        ("task = [1]\n", "task must be a string or a list of strings"),
        ('sync-every = "0,x"\n', "sync-every: 'x' must be a whole number"),
        ("[rounds]\nx = 1\n", "rounds must be a single value, not a table"),
        ("rounds = 1\nROUNDS = 2\n", "unknown key 'ROUNDS'"),
        ("sync_every = [1]\nsync-every = [2]\n", "'sync_every' and 'sync-every' are one key; keep one of them"),
    ],
)
def test_a_bad_file_is_one_sentence_naming_the_file_and_the_fix(tmp_path: Path, text: str, words: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(OptionFileError) as caught:
        load_option_file(path, KEYS, missing_hint="")
    message = str(caught.value)
    assert message.startswith(f"config file {path}") and words in message, message
    assert "\n" not in message


def test_bad_json_names_its_line_and_a_missing_file_the_commands_hint(tmp_path: Path) -> None:
    path = _write(tmp_path, '{"rounds": 3,\n "lr": }\n', "c.json")
    with pytest.raises(OptionFileError, match=r"c.json is not valid JSON at line 2 \(expecting value\); write one"):
        load_option_file(path, KEYS, missing_hint="")
    with pytest.raises(OptionFileError, match=r"c.json must be one JSON object"):
        load_option_file(_write(tmp_path, "[1, 2]", "c.json"), KEYS, missing_hint="")
    with pytest.raises(OptionFileError, match=r"nope.toml does not exist; make one like this$"):
        load_option_file(tmp_path / "nope.toml", KEYS, missing_hint="make one like this")


def test_ignored_keys_are_taken_unchecked_and_listed_as_valid(tmp_path: Path) -> None:
    path = _write(tmp_path, 'nodes = "any"\nrounds = 2\n')
    assert load_option_file(path, KEYS, ignored={"nodes"}, missing_hint="") == {"rounds": 2}
    with pytest.raises(OptionFileError, match="valid keys are: lr, nodes, resume"):
        load_option_file(_write(tmp_path, "x = 1\n"), KEYS, ignored={"nodes"}, missing_hint="")


# the node's config file (start, join, local) goes through the loader


def test_a_good_node_file_sets_the_flags_defaults(tmp_path: Path) -> None:
    path = _write(tmp_path, 'sampling = "uniform"\nno-relay = true\nsync_window = 2\nnodes = 3\n')
    args = _parse(build_parser(), ["local", "--config", str(path)])
    assert (args.sampling, args.use_relay, args.matchmaking_timeout_s, args.nodes) == ("uniform", False, 2.0, 3)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('sampling = "greedy"\n', "sampling = 'greedy' must be one of uniform, advantage, credit"),
        ("sync-window = true\n", "sync-window = True must be a number"),
        ("rounds = 3\nmodel = tiny-s\n", "is not valid TOML at line 2"),
        ("max_thread = 2\n", "unknown key 'max_thread' (did you mean 'max-threads'?)"),
    ],
)
def test_a_bad_node_file_is_refused_in_one_sentence(
    tmp_path: Path, text: str, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, text)
    assert main(["start", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"swarm-node: error: config file {path}") and words in err, err
    assert len(err.strip().splitlines()) == 1


# experiment's config file goes through the same loader


def test_a_good_experiment_file_in_toml_with_the_flags_spellings(tmp_path: Path) -> None:
    text = 'splits = "8/0,4/4"\nsync-every = [0, 10]\nlr = 0.01\nprogress = false\ngenerations = 4\nnodes = 2\n'
    path = _write(tmp_path, text, "exp.toml")
    args = build_parser().parse_args(["experiment", "--config", str(path), "--nodes", "3"])
    cfg = config_from_args(args)
    assert (cfg.splits, cfg.sync_every, cfg.learning_rate, cfg.progress) == (("8/0", "4/4"), (0, 10), 0.01, False)
    assert (cfg.num_generations, cfg.nodes) == (4, 3)  # the flag wins over the file
    assert isinstance(cfg, ExperimentConfig)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('nodes = "four"\n', "nodes = 'four' must be a whole number"),
        ("splits = [8, 0]\n", "splits must be a string or a list of strings"),
        ('aggregator = "sum"\n', "aggregator = 'sum' must be one of mean, trimmed_mean, median, centered_clip"),
        ("sedes = 2\n", "unknown key 'sedes' (did you mean 'seeds'?); valid keys are: adapter,"),
        ("nodes = \n", "is not valid TOML at line 1"),
    ],
)
def test_a_bad_experiment_file_is_refused_in_one_sentence(
    tmp_path: Path, text: str, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, text, "exp.toml")
    with pytest.raises(OptionFileError) as caught:
        load_config_file(path)
    assert words in str(caught.value), caught.value
    assert main(["experiment", "--config", str(path)]) == 2  # refused before a sweep starts
    err = capsys.readouterr().err
    assert err.startswith(f"swarm-node: error: config file {path}") and words in err, err
