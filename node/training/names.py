"""The model registry's names, importable without torch: the command line checks ``--model`` with them
before anything heavy loads (:mod:`node.training.models` holds the registry itself; a test ties the two)."""

from __future__ import annotations

import os

BUILTIN_MODEL_NAMES = ("tiny-bpe", "tiny-gpt2", "tiny-l", "tiny-m", "tiny-s")
PACKAGED_MODEL_NAMES = ("smollm2-135m",)


def model_name_error(name_or_path: str, flag: str = "--model") -> str | None:
    """Why ``name_or_path`` names no model (one sentence naming ``flag``), or None: a registry name or a folder."""
    if name_or_path in BUILTIN_MODEL_NAMES or name_or_path in PACKAGED_MODEL_NAMES or os.path.isdir(name_or_path):
        return None
    if os.path.exists(name_or_path):
        return f"{flag} {name_or_path}: {os.path.abspath(name_or_path)} is a file; give a model folder or a name"
    valid = ", ".join([*BUILTIN_MODEL_NAMES, *PACKAGED_MODEL_NAMES])
    return f"{flag} {name_or_path}: unknown model; use one of {valid} or the path of a local Hugging Face model folder"
