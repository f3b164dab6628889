"""``swarm-node eval``: score a model or a node's checkpoint on the held-out evaluation set.

Training reward depends on the stream a node trained on, so it cannot compare
two runs; the held-out set (:mod:`node.tasks.heldout`) is the same everywhere,
so this command gives one number per checkpoint that any run can be compared
with, the same number a node logs in its ``eval`` events.

Bad input is found before torch is imported where it can be (ranges, task
names, paths), so a typo costs a moment, not a model load. A checkpoint of an
adapter node holds only its adapter: the base is rebuilt as the node built it
(a built-in model from :data:`~node.training.adapters.SHARED_BASE_SEED`) and the
adapter from the settings its identity records.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from node.cli.errors import CliError
from node.tasks.registry import BUILTIN_TASKS, TaskFamily, UnknownTask, build_task, task_names

if TYPE_CHECKING:
    from node.training.evaluate import EvalResult
    from node.training.policy import Policy

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "tiny-s"
_ADAPTER = re.compile(
    r"base (?P<base>[0-9a-f]+), (?P<kind>\w+) r=(?P<rank>\d+) alpha=(?P<alpha>\d+) on (?P<targets>\S+)"
)
"""An adapter identity as :func:`~node.training.adapters.attach_adapter` records it (``describe``'s format)."""


@dataclass(frozen=True)
class Loaded:
    """The model to score and where its weights came from."""

    policy: Policy
    checkpoint: Path | None
    round: int | None


def add_eval_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``eval`` subcommand to the subparsers of ``swarm-node``."""
    p: argparse.ArgumentParser = sub.add_parser(
        "eval", help="score a model or a node's checkpoint on held-out questions"
    )
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"built-in or packaged model name, or a HF model folder "
                   f"(default {DEFAULT_MODEL}); with --checkpoint, the model it was trained from")  # fmt: skip
    p.add_argument("--checkpoint", default=None, metavar="PATH",
                   help="a checkpoint.pt, or a node's run folder (<log-dir>/<peer>) holding one")  # fmt: skip
    p.add_argument("--task", action="append", default=[], metavar="FAMILY",
                   help="task family to score (repeatable; default: the model's recommended families)")  # fmt: skip
    p.add_argument("--items", type=int, default=64, help="held-out questions per family, 1-4096 (default 64)")
    p.add_argument("--samples", type=int, default=8, help="sampled completions per question, 0-64 (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=0, help="0: the model's default (default 0)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature, 0-100 (default 1.0)")
    p.add_argument("--timeout", type=float, default=600.0, help="stop scoring after this many seconds (default 600)")
    p.add_argument("--seed", type=int, default=0, help="initial weights of a built-in model without --checkpoint")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or mps (default auto)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more log detail")
    return p


def run_eval(args: argparse.Namespace) -> int:
    """Entry point of ``swarm-node eval``: validate, load, score, print; returns the exit status."""
    _check_ranges(args)
    checkpoint = _checkpoint_path(args.checkpoint)
    families = _families(args)
    from node.training.evaluate import EvalConfig, eval_sets, evaluate, short_sets  # heavy: torch and transformers
    from node.training.models import recommended_defaults
    from node.training.policy import GenerationConfig

    loaded = _load(args, checkpoint)
    max_new = args.max_new_tokens or recommended_defaults(args.model).max_new_tokens
    generation = GenerationConfig(temperature=args.temperature, top_p=1.0, max_new_tokens=max_new)
    cfg = EvalConfig(eval_every=0, eval_items=args.items, eval_samples=args.samples, eval_timeout_s=args.timeout)
    sets = eval_sets(families, cfg.eval_items)
    logger.info("scoring %d held-out questions of %s", sum(map(len, sets.values())), ",".join(sets))
    if short := short_sets(sets, cfg.eval_items):
        logger.warning("%s", short)
    result = evaluate(loaded.policy, families, sets, generation, cfg)
    scored = _scored_per_family({k: len(v) for k, v in sets.items()}, result.items)
    per_family = {name: result.per_family.get(families[name].name, 0.0) for name in sets}
    if args.json:
        print(_json(loaded, scored, result))
    else:
        print(_table(loaded, args, per_family, scored, result))
    return 0


def _check_ranges(args: argparse.Namespace) -> None:
    """One sentence naming the flag for a number out of range (before anything heavy is imported)."""
    checks = [
        (1 <= args.items <= 4096, f"--items {args.items}: use 1-4096 questions per family"),
        (0 <= args.samples <= 64, f"--samples {args.samples}: use 0 (greedy only) to 64"),
        (0 <= args.max_new_tokens <= 4096, f"--max-new-tokens {args.max_new_tokens}: use 0 (the model's) to 4096"),
        (0.0 <= args.temperature <= 100.0, f"--temperature {args.temperature:g}: use 0 (greedy) to 100, e.g. 1.0"),
        (args.timeout > 0, f"--timeout {args.timeout:g}: use a positive number of seconds, e.g. 600"),
        (args.seed >= 0, f"--seed {args.seed}: use a non-negative integer"),
    ]
    for ok, message in checks:
        if not ok:
            raise CliError(message)


def _families(args: argparse.Namespace) -> dict[str, TaskFamily]:
    """The families to score: ``--task``, else the model's recommended ones, else every tiny built-in."""
    names = args.task or _recommended_tasks(args.model) or list(BUILTIN_TASKS)
    families: dict[str, TaskFamily] = {}
    for name in dict.fromkeys(names):
        try:
            families[name] = build_task(name)
        except UnknownTask:
            raise CliError(f"--task {name}: unknown task family; use one of {', '.join(task_names())}") from None
    return families


def _recommended_tasks(model: str) -> tuple[str, ...]:
    """The model's recommended families; torch is imported only when needed (no ``--task`` given)."""
    from node.training.models import recommended_defaults

    return recommended_defaults(model).tasks


def _checkpoint_path(text: str | None) -> Path | None:
    """``--checkpoint`` as an existing path (a file, or a folder searched later), or None when not given."""
    if text is None:
        return None
    path = Path(text).expanduser()
    if not path.exists():
        raise CliError(f"--checkpoint {text}: no such file or folder; pass a checkpoint.pt or a node's run folder")
    return path


def _read_checkpoint(path: Path) -> tuple[dict[str, Any], Path]:
    """The checkpoint state in ``path``: a file, a run folder, or a log folder with one run folder in it."""
    from node.core import checkpoint

    if path.is_file():
        try:
            return checkpoint.decode(path.read_bytes()), path
        except (ValueError, RuntimeError, EOFError, OSError) as e:
            raise CliError(f"--checkpoint {path}: not an intact checkpoint ({e}); pass another checkpoint.pt") from None
    runs = sorted(p.parent for p in path.glob(f"*/{checkpoint.CURRENT}"))
    folder = runs[0] if not (path / checkpoint.CURRENT).exists() and len(runs) == 1 else path
    try:
        found = checkpoint.load_latest(folder)
    except checkpoint.CheckpointError as e:
        raise CliError(f"--checkpoint {path}: {e}") from None
    if found is None:
        several = f" (it holds several runs: {', '.join(p.name for p in runs)})" if runs else ""
        raise CliError(
            f"--checkpoint {path} holds no {checkpoint.CURRENT}{several}; pass a checkpoint.pt or one run folder"
        )
    return found


def _load(args: argparse.Namespace, path: Path | None) -> Loaded:
    """The policy to score: ``--model`` with ``--seed``'s initial weights, or with the checkpoint's weights."""
    from node.training.adapters import SHARED_BASE_SEED
    from node.training.device import resolve_device
    from node.training.models import ModelError, load_model
    from node.training.policy import Policy

    state, file = _read_checkpoint(path) if path is not None else ({}, None)
    adapter = state.get("adapter")
    try:
        device = resolve_device(args.device)
    except ValueError as e:
        raise CliError(str(e)) from None
    # an adapter node's base is the shared init, whatever seed it ran with
    seed = SHARED_BASE_SEED if isinstance(adapter, str) else args.seed
    try:
        model, tokenizer, model_id = load_model(args.model, seed=seed, device=device)
    except ModelError as e:
        raise CliError(f"--model {args.model}: {e}") from None
    if file is not None:
        model = _restore(model, model_id, state, file)
        logger.info("loaded the weights of %s (round %s)", file, state.get("round"))
    rnd = state.get("round")
    return Loaded(Policy(model, tokenizer, model_id, device), file, None if rnd is None else int(rnd))


def _restore(model: Any, model_id: str, state: dict[str, Any], file: Path) -> Any:
    """Put the checkpoint's weights into ``model`` (attaching its adapter first); returns the model to score."""
    from node.core.state import FORMAT

    if state.get("format") != FORMAT:
        raise CliError(f"--checkpoint {file} has format {state.get('format')!r}, not {FORMAT}; pass a node checkpoint")
    if state.get("model_id") != model_id:
        raise CliError(f"--checkpoint {file} is of model {state.get('model_id')}, not {model_id}; "
                       f"pass --model {state.get('model_id')} (or the folder it was loaded from)")  # fmt: skip
    adapter = state.get("adapter")
    if isinstance(adapter, str):
        return _restore_adapter(model, adapter, state["model"], file)
    try:
        model.load_state_dict(state["model"])
    except (RuntimeError, KeyError) as e:
        lines = [line.strip() for line in str(e).strip().splitlines()]
        first = lines[min(1, len(lines) - 1)][:200]  # torch's first line only says "Error(s) in loading"
        raise CliError(f"--checkpoint {file} does not fit --model {model_id} ({first}); pass the --model it was "
                       "trained with") from None  # fmt: skip
    return model


def _restore_adapter(model: Any, identity: str, weights: dict[str, Any], file: Path) -> Any:
    """Attach the adapter ``identity`` describes to ``model`` and load its weights; a CliError if it cannot."""
    from node.training.adapters import AdapterConfig, adapter_identity, attach_adapter, load_trainable_state

    match = _ADAPTER.fullmatch(identity)
    if match is None:
        raise CliError(f"--checkpoint {file} holds an adapter ({identity}) whose settings are not recorded in a form "
                       "this version reads; evaluate it with the swarm-node version that wrote it")  # fmt: skip
    try:
        cfg = AdapterConfig(match["kind"], int(match["rank"]), int(match["alpha"]), 0.0, match["targets"])
        model = attach_adapter(model, cfg, seed=0)  # the adapters' init is overwritten by the checkpoint's
    except ValueError as e:
        raise CliError(f"--checkpoint {file}: its adapter ({identity}) does not fit --model ({e})") from None
    if adapter_identity(model) != identity:
        raise CliError(f"--checkpoint {file} holds an adapter on another base ({identity}, here "
                       f"{adapter_identity(model)}); pass the --model the node trained")  # fmt: skip
    try:
        load_trainable_state(model, weights)
    except ValueError as e:
        raise CliError(f"--checkpoint {file}: {e}") from None
    return model


def _scored_per_family(sizes: dict[str, int], scored: int) -> dict[str, int]:
    """Questions scored per family: :func:`~node.training.evaluate.evaluate` goes family by family, in order."""
    out: dict[str, int] = {}
    for name, size in sizes.items():
        out[name] = min(size, scored)
        scored -= out[name]
    return out


def _json(loaded: Loaded, scored: dict[str, int], result: EvalResult) -> str:
    """The ``--json`` output: the node's ``eval`` event fields, with what was scored."""
    source = None if loaded.checkpoint is None else str(loaded.checkpoint)
    head = {"model": loaded.policy.model_id, "checkpoint": source, "round": loaded.round, "questions": scored}
    return json.dumps({**head, **result.to_event()})


def _table(
    loaded: Loaded, args: argparse.Namespace, accuracy: dict[str, float], scored: dict[str, int], result: EvalResult
) -> str:
    """The default output: questions and greedy accuracy per family, then the totals."""
    source = "initial weights" if loaded.checkpoint is None else f"{loaded.checkpoint}, round {loaded.round}"
    width = max(len("family"), *(len(n) for n in scored))
    lines = [f"held-out evaluation of {loaded.policy.model_id} ({source})",
             f"{'family':<{width}}  questions  accuracy"]  # fmt: skip
    lines += [f"{name:<{width}}  {scored[name]:>9}  {accuracy[name]:>8.3f}" for name in scored]
    lines.append(f"{'total':<{width}}  {result.items:>9}  {result.accuracy:>8.3f}")
    if result.sample_reward is not None:
        lines.append(f"sampled reward ({args.samples} per question, temperature {args.temperature:g}): "
                     f"{result.sample_reward:.3f}")  # fmt: skip
    if not result.complete:
        lines.append(f"stopped after --timeout {args.timeout:g} s: not every question was scored")
    lines.append(f"({result.eval_s:.1f} s)")
    return "\n".join(lines)
