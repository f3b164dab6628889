"""``swarm-node export``: take a node's model out as a Hugging Face model folder.

From a node's checkpoint (``--checkpoint``: a ``checkpoint.pt``, a node's run folder
``<log-dir>/<peer>``, or a log folder holding one run) or from a model's initial weights
(``--model`` alone). A LoRA adapter is merged into the base weights by default; ``--peft`` saves
it as a PEFT adapter folder instead (see :mod:`node.training.export` for both layouts). The
folder loads with plain transformers, no swarm-node needed::

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained("exported")
    model = AutoModelForCausalLM.from_pretrained("exported")
    inputs = tokenizer("max 3941=", return_tensors="pt")
    answer = model.generate(**inputs, max_new_tokens=1, do_sample=False)
    print(tokenizer.decode(answer[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))

An instruct model (SmolLM2) answers best through its chat template, as a node prompts it:
``tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
return_tensors="pt")``. A ``--peft`` folder loads the same way once ``pip install peft`` is done.

Bad input is found before torch is imported where it can be (the output folder, the checkpoint's
path, flags that contradict each other), so a typo costs a moment, not a model load. The export
runs on the CPU in float32: merging there is exact to float rounding whatever device trained it.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from node.cli.errors import CliError
from node.cli.evaluate import _checkpoint_path, _read_checkpoint, _restore

logger = logging.getLogger(__name__)


def add_export_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``export`` subcommand to the subparsers of ``swarm-node``."""
    p: argparse.ArgumentParser = sub.add_parser(
        "export", help="write a node's model as a Hugging Face model folder (LoRA merged)"
    )
    p.add_argument("out", metavar="FOLDER", help="the folder to write (new, empty, or an earlier export with --force)")
    p.add_argument("--checkpoint", default=None, metavar="PATH",
                   help="a checkpoint.pt, or a node's run folder (<log-dir>/<peer>) holding one")  # fmt: skip
    p.add_argument("--model", default=None, help="built-in or packaged model name, or a HF model folder; default: "
                   "the checkpoint's model (a local folder must be named)")  # fmt: skip
    p.add_argument("--peft", action="store_true",
                   help="save a LoRA node's adapter as a PEFT adapter folder instead of merging it")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="initial weights of a built-in model without --checkpoint")
    p.add_argument("--force", action="store_true", help="replace FOLDER if an earlier export wrote it")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more log detail")
    return p


def run_export(args: argparse.Namespace) -> int:
    """Entry point of ``swarm-node export``: check, load, write, say where; returns the exit status."""
    out = output_folder(args.out, args.force)
    checkpoint = _checkpoint_path(args.checkpoint)
    if checkpoint is not None and checkpoint.is_dir() and not _holds_checkpoint(checkpoint):
        raise CliError(f"--checkpoint {args.checkpoint} holds no checkpoint.pt; pass a checkpoint.pt or a node's "
                       "run folder (<log-dir>/<peer>)")  # fmt: skip
    if checkpoint is None and args.model is None:
        raise CliError("export needs --checkpoint (a node's run folder) or --model NAME (its initial weights)")
    if args.peft and checkpoint is None:
        raise CliError("--peft saves a trained adapter: pass the --checkpoint of a node that ran with --adapter lora")
    if args.seed < 0:
        raise CliError(f"--seed {args.seed}: use a non-negative integer")
    from node.training.export import ExportFormat, export_model, quiet_transformers  # heavy: torch, transformers

    with quiet_transformers():  # a progress bar per load is noise in a command that prints one line
        model, tokenizer, provenance, base_path = _load(args, checkpoint)
    fmt = ExportFormat.PEFT if args.peft else ExportFormat.MERGED
    try:
        export_model(model, tokenizer, out, fmt, provenance, base_path if args.peft else None)
    except OSError as e:
        raise CliError(f"{args.out}: the export could not be written ({e.strerror or e}); free space or name "
                       "another folder") from None  # fmt: skip
    what = "its adapter as PEFT" if args.peft else "LoRA merged" if provenance["adapter"] else "all weights"
    source = f"round {provenance['round']}" if provenance["round"] is not None else "initial weights"
    print(f"exported {provenance['model']} ({source}, {what}) to {out}; "
          f"load it with AutoModelForCausalLM.from_pretrained({str(out)!r})")  # fmt: skip
    return 0


def output_folder(text: str, force: bool) -> Path:
    """``FOLDER`` as a path to write: new, empty, or (with ``force``) an earlier export; a CliError otherwise.

    ``--force`` never replaces a folder an export did not write: it would delete whatever else is in it.
    """
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise CliError(f"{text} is a file; name a new folder to export into")
    if path.is_dir() and any(path.iterdir()):
        if not (path / "swarm_node.json").is_file():  # node.training.export.PROVENANCE_FILE, without torch
            raise CliError(f"{text} is a folder with other files in it; name a new or empty folder")
        if not force:
            raise CliError(f"{text} holds an earlier export; pass --force to replace it or name a new folder")
    parent = path.resolve().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not _writable(parent):
        raise CliError(f"{text}: {parent} is not a folder this user may write to; name another folder")
    return path


def _holds_checkpoint(folder: Path) -> bool:
    """Whether a folder holds a checkpoint file, or a run folder that does: looked for without torch."""
    names = ("checkpoint.pt", "checkpoint.prev.pt")  # node.core.checkpoint.CURRENT and PREVIOUS
    return any((folder / n).is_file() for n in names) or any(folder.glob(f"*/{names[0]}"))


def _writable(folder: Path) -> bool:
    """Whether a folder can be made in ``folder``: tried, since permission bits do not bind root (nor /proc)."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".swarm-node-export-probe.", dir=folder))
    except OSError:
        return False
    return True


def _load(args: argparse.Namespace, path: Path | None) -> tuple[Any, Any, dict[str, object], str | None]:
    """The model and tokenizer to export, what to record of them, and the folder a local base loads from."""
    from node.training.adapters import SHARED_BASE_SEED
    from node.training.models import PACKAGED_MODELS, ModelError, load_model, resolve_model_path

    state, file = _read_checkpoint(path) if path is not None else ({}, None)
    name = args.model or _model_of(state, file)
    adapter = state.get("adapter")
    if args.peft and not isinstance(adapter, str):
        raise CliError(f"--checkpoint {file} holds fully fine-tuned weights, not an adapter; drop --peft")
    if file is not None and state.get("model_id") != _model_id(name):  # said before a model load, not after
        raise CliError(f"--checkpoint {file} is of model {state.get('model_id')}, not {_model_id(name)}; "
                       f"pass --model {state.get('model_id')} (or the folder it was loaded from)")  # fmt: skip
    # an adapter node's base is the shared init, whatever seed it ran with
    seed = SHARED_BASE_SEED if isinstance(adapter, str) else args.seed
    try:
        model, tokenizer, model_id = load_model(name, seed=seed, device="cpu")
        local = resolve_model_path(name)
    except ModelError as e:
        raise CliError(f"--model {name}: {e}") from None
    if file is not None:
        model = _restore(model, model_id, state, file)
    rnd = state.get("round")
    provenance: dict[str, object] = {
        "model": model_id,
        "checkpoint": None if file is None else str(file.resolve()),
        "round": None if rnd is None else int(rnd),
        "adapter": adapter if isinstance(adapter, str) else None,
        "seed": None if file is not None else seed,
    }
    base_path = None if local is None or name in PACKAGED_MODELS else str(Path(local).resolve())
    return model, tokenizer, provenance, base_path


def _model_id(name: str) -> str:
    """The id a node gives the model it loads by ``name`` (:func:`node.training.models.load_model`'s)."""
    from node.training.names import BUILTIN_MODEL_NAMES, PACKAGED_MODEL_NAMES

    if name in BUILTIN_MODEL_NAMES or name in PACKAGED_MODEL_NAMES:
        return name
    return os.path.basename(os.path.normpath(os.path.abspath(name)))[:128] or "local-model"


def _model_of(state: dict[str, Any], file: Path | None) -> str:
    """The registry name a checkpoint's model was loaded by; a CliError for a local folder (its path is not kept)."""
    from node.training.names import BUILTIN_MODEL_NAMES, PACKAGED_MODEL_NAMES

    model_id = state.get("model_id")
    if model_id in BUILTIN_MODEL_NAMES or model_id in PACKAGED_MODEL_NAMES:
        return str(model_id)
    raise CliError(f"--checkpoint {file} is of the local model {model_id!r}; pass --model with the folder it was "
                   "loaded from")  # fmt: skip
