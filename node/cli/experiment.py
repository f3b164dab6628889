"""``swarm-node experiment``: flags generated from :class:`ExperimentConfig`, and the command itself."""

from __future__ import annotations

import argparse
import signal
from dataclasses import fields
from pathlib import Path
from types import FrameType
from typing import Any

from node.cli.errors import CliError
from node.experiments.config import LIST_FIELDS, ExperimentConfig, flag_of, load_config_file


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def add_experiment_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``experiment`` subcommand to the subparsers of ``swarm-node``."""
    p: argparse.ArgumentParser = sub.add_parser(
        "experiment", help="SAPO's sharing table: local swarms per split and seed, table and plots"
    )
    p.add_argument("--config", default=None, help="TOML or JSON file with ExperimentConfig fields")
    for f in fields(ExperimentConfig):
        flag, helptext, dest = flag_of(f), f.metadata["help"], f.name
        if f.name in LIST_FIELDS:
            shown = ",".join(map(str, _default(f.name))) or "none"
            p.add_argument(
                flag, dest=dest, type=_csv, default=None, help=f"{helptext} (comma-separated; default {shown})"
            )
        elif isinstance(_default(f.name), bool):  # a switch: --no-NAME turns a default-on field off
            p.add_argument("--no-" + flag[2:], dest=dest, action="store_false", default=None, help=f"off: {helptext}")
        else:
            kind = _kind(str(f.type))
            p.add_argument(flag, dest=dest, type=kind, default=None, help=f"{helptext} (default {_default(f.name)})")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more log detail")
    return p


def _kind(annotation: str) -> type:
    """The flag's parser from the field's annotation ("float | None" -> float): one source of truth."""
    kinds: dict[str, type] = {"float": float, "int": int, "str": str}
    return kinds[annotation.split("|")[0].strip()]


def _default(name: str) -> Any:
    return getattr(ExperimentConfig(), name)


def config_from_args(args: argparse.Namespace) -> ExperimentConfig:
    """File values (if ``--config``), overridden by the flags given; raises ValueError."""
    values: dict[str, Any] = {}
    if args.config:
        values.update(load_config_file(Path(args.config)))
    for f in fields(ExperimentConfig):
        given = getattr(args, f.name, None)
        if given is not None:
            values[f.name] = given
    return ExperimentConfig(**values)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run_experiment_cli(args: argparse.Namespace) -> int:
    """Entry point of ``swarm-node experiment``; returns the exit status."""
    from node.experiments.sweep import run_sweep

    try:
        cfg = config_from_args(args)
    except ValueError as e:
        raise CliError(str(e)) from None
    signal.signal(signal.SIGTERM, _raise_interrupt)  # SIGTERM stops the current run cleanly, like Ctrl-C
    try:
        report = run_sweep(cfg)
    except KeyboardInterrupt:
        print(f"\nswarm-node experiment: interrupted; run the same command again to resume in {cfg.out}")
        return 130
    out = Path(cfg.out)
    print(f"swarm-node experiment: {len(report.results)} runs finished ({report.skipped} from before)")
    if report.failed:
        print(f"failed (rerun the command to retry): {', '.join(report.failed)}")
    if report.results:
        print((out / "results.md").read_text())
        print(f"results: {out / 'results.json'}, {out / 'results.md'}, {out / 'reward_curves.png'}")
    return 1 if report.failed else 0
