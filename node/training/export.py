"""Writing a node's model as a Hugging Face model folder that plain transformers loads.

Two layouts (:class:`ExportFormat`):

- ``merged`` (the default): one causal-LM folder (``config.json``, ``model.safetensors``,
  ``generation_config.json``) with any LoRA adapter merged into the base weights, in float32;
- ``peft``: a PEFT adapter folder (``adapter_config.json``, ``adapter_model.safetensors``) for a
  node that trained an adapter. Its base is written beside it in ``base/`` when no one else has it
  (a built-in model's seed-derived init, a packaged model de-quantised from its GGUF file); a local
  model folder is referred to by its absolute path instead of copied.

Both hold the tokenizer, so ``AutoTokenizer.from_pretrained(folder)`` and
``AutoModelForCausalLM.from_pretrained(folder)`` load them without swarm-node (the ``peft`` layout
needs the ``peft`` package installed). The built-in models' character tokenizer is a
``tokenizers`` WordLevel model already (:mod:`node.training.tokenizer`); it is saved under the class
name ``PreTrainedTokenizerFast``, which every transformers version since 4 reads. The folder also
holds :data:`PROVENANCE_FILE`: which model, checkpoint, round and adapter it came from.

A folder is written into a temporary sibling and renamed into place, so an export that fails
midway leaves no half folder under the asked name.
"""

from __future__ import annotations

import copy
import enum
import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from node.training.adapters import adapter_identity

logger = logging.getLogger(__name__)

PROVENANCE_FILE = "swarm_node.json"
"""What an export records about its source; also how ``--force`` tells an earlier export from other files."""

BASE_FOLDER = "base"
"""Where a ``peft`` export writes the base model its adapter applies to, when it writes one."""

PORTABLE_TOKENIZER_CLASS = "PreTrainedTokenizerFast"
"""The class name transformers 4 and 5 both load a ``tokenizer.json`` with (5 saves its own new name)."""


class ExportFormat(enum.Enum):
    """The layout of an exported folder."""

    MERGED = "merged"
    PEFT = "peft"


class NoAdapter(ValueError):
    """A ``peft`` export of a model that trains every weight: it has no adapter to save."""


def package_version() -> str:
    """This package's installed version (from its metadata), or "unknown" in a tree never installed."""
    try:
        return importlib.metadata.version("swarm-node")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def export_model(
    model: Any,
    tokenizer: Any,
    out: Path,
    fmt: ExportFormat = ExportFormat.MERGED,
    provenance: Mapping[str, object] | None = None,
    base_path: str | None = None,
) -> Path:
    """Write ``model`` and ``tokenizer`` as a folder at ``out``; returns the folder; ``model`` is left as it was.

    ``base_path``: for a ``peft`` export, the folder the base loads from (a local model folder);
    None writes the base into ``out/base``. A folder already at ``out`` is replaced only once the new
    one is complete (the caller decides whether it may be).
    """
    identity = adapter_identity(model)
    if fmt is ExportFormat.PEFT and identity is None:
        raise NoAdapter("this model trains every weight and has no adapter to save; export it merged")
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".export", dir=out.parent))
    try:
        with quiet_transformers():
            if fmt is ExportFormat.MERGED:
                _write_merged(model, tokenizer, tmp)
            else:
                base_path = base_path or str(out / BASE_FOLDER)
                _write_peft(model, tokenizer, tmp, base_path, write_base=base_path == str(out / BASE_FOLDER))
        record = {
            "exported_by": f"swarm-node {package_version()}",
            "format": fmt.value,
            "adapter": identity,
            "base": base_path if fmt is ExportFormat.PEFT else None,
            **(provenance or {}),
        }
        (tmp / PROVENANCE_FILE).write_text(json.dumps(record, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("exported %s (%s) to %s", record.get("model", "the model"), fmt.value, out)
    return out


def merged(model: Any) -> Any:
    """A float32 copy of ``model`` with its adapter merged into the base weights (``model`` itself if it has none).

    peft's merge adds ``B @ A * alpha / r`` to each adapted weight (transposed for GPT-2's Conv1D),
    so the copy computes what the adapted model computes, to float rounding.
    """
    if adapter_identity(model) is None:
        return model
    return copy.deepcopy(model).merge_and_unload().to(torch.float32)


def _write_merged(model: Any, tokenizer: Any, folder: Path) -> None:
    plain = merged(model)
    plain.save_pretrained(folder)
    save_tokenizer(tokenizer, folder)


def _write_peft(model: Any, tokenizer: Any, folder: Path, base_path: str, write_base: bool) -> None:
    """The adapter files (and the base in ``folder/base`` when ``write_base``), with the tokenizer in each."""
    if write_base:
        base = copy.deepcopy(model).unload().to(torch.float32)
        base.save_pretrained(folder / BASE_FOLDER)
        save_tokenizer(tokenizer, folder / BASE_FOLDER)
    peft_config = model.peft_config["default"]
    before = peft_config.base_model_name_or_path
    peft_config.base_model_name_or_path = base_path  # where AutoModelForCausalLM finds the base
    try:
        model.save_pretrained(folder)
    finally:
        peft_config.base_model_name_or_path = before
    save_tokenizer(tokenizer, folder)


def save_tokenizer(tokenizer: Any, folder: Path) -> None:
    """``save_pretrained``, with a class name every transformers version loads where the saved one is version 5's."""
    tokenizer.save_pretrained(folder)
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    if config.get("tokenizer_class") == "TokenizersBackend":
        config["tokenizer_class"] = PORTABLE_TOKENIZER_CLASS
        config_file.write_text(json.dumps(config, indent=2) + "\n")


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """No progress bars while loading or saving, and no peft warning about a base config it looks up on the Hub."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            # peft looks for the base's config to see whether the vocabulary changed (it did not: only
            # adapter weights train) and warns where the base is a folder not yet written or not on the Hub
            warnings.filterwarnings("ignore", message="Could not find a config file", category=UserWarning)
            yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()
