"""``swarm-node experiment``: flags generated from :class:`ExperimentConfig` (as a node's from its options), and
the command itself."""

from __future__ import annotations

import argparse
import signal
from dataclasses import fields
from pathlib import Path
from types import FrameType
from typing import Any

from node.cli.errors import CliError
from node.cli.flags import add_option_flags
from node.experiments.config import ExperimentConfig, load_config_file


def add_experiment_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``experiment`` subcommand to the subparsers of ``swarm-node``: its flags come from the node's
    generator, each defaulting to None so that ``--config``'s values show through where no flag is given."""
    p: argparse.ArgumentParser = sub.add_parser(
        "experiment", help="SAPO's sharing table: local swarms per split and seed, table and plots"
    )
    p.add_argument("--config", default=None, help="TOML or JSON file with ExperimentConfig fields")
    add_option_flags(p, ExperimentConfig, overlay=True)
    p.add_argument("-v", "--verbose", action="count", default=0, help="more log detail")
    return p


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
    from node.experiments.sweep import check_sweep, run_sweep

    try:
        cfg = config_from_args(args)
        check_sweep(cfg)
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
        print(f"results: {out / 'results.json'} (as CSV: {out / 'results.csv'}, {out / 'summary.csv'}), ", end="")
        print(f"{out / 'results.md'}, {out / 'reward_curves.png'}")
    return 1 if report.failed else 0
