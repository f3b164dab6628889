"""The BPE tokenizer of ``tiny-bpe``: exact round trips, the character tokenizer's special ids, merges that
shorten the tasks' prompts, one vocabulary in every build and process, and a model that generates and trains."""

from __future__ import annotations

import math
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from node.tasks.builtin import BUILTIN_TASKS
from node.tasks.verify import TrainGroup
from node.training.grpo import GRPOConfig, GRPOTrainer
from node.training.models import load_model, recommended_defaults
from node.training.policy import GenerationConfig, Policy
from node.training.tokenizer import (
    BPE_VOCAB_SIZE,
    CHARACTERS,
    SPECIAL_TOKENS,
    _bpe_core_json,
    bpe_tokenizer,
    char_tokenizer,
    max_token_chars,
)
from protocol.schema import TaskRef

PROMPTS = ["max 3941=", "min 123456789012=", "pos2 3941=", "count7 3771=", "3+8+5%10=", "par 3941="]


@pytest.fixture(scope="module")
def policy() -> Policy:
    torch.set_num_threads(1)
    model, tok, model_id = load_model("tiny-bpe", seed=0, device="cpu")
    return Policy(model, tok, model_id)


def test_round_trip_of_random_printable_text() -> None:
    tok = bpe_tokenizer()
    rng = random.Random(0)
    texts = ["".join(rng.choice(CHARACTERS) for _ in range(rng.randrange(1, 60))) for _ in range(300)]
    texts += ["  two  spaces ", "\n\nnewlines\n", " max 3941=", "max  3941 =", CHARACTERS, ""]
    for text in texts:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in ids, text
        assert tok.decode(ids) == text


def test_special_tokens_and_bos_as_the_character_tokenizer() -> None:
    tok, char = bpe_tokenizer(), char_tokenizer()
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    ids = ("pad_token_id", "eos_token_id", "bos_token_id", "unk_token_id", "padding_side")
    assert [getattr(tok, k) for k in ids] == [getattr(char, k) for k in ids]
    with_bos = tok("max 12=")["input_ids"]
    assert with_bos[0] == tok.bos_token_id and tok.eos_token_id not in with_bos
    assert with_bos[1:] == tok("max 12=", add_special_tokens=False)["input_ids"]
    assert tok.decode(with_bos, skip_special_tokens=True) == "max 12="
    assert tok("é", add_special_tokens=False)["input_ids"] == [tok.unk_token_id]  # as the character tokenizer


def test_merges_shorten_prompts_and_every_answer_is_one_token() -> None:
    tok = bpe_tokenizer()
    assert len(tok) == BPE_VOCAB_SIZE
    assert len(tok("max 3941=", add_special_tokens=False)["input_ids"]) < len("max 3941=")
    assert tok.tokenize("max") == ["max"]
    assert all(len(tok(p, add_special_tokens=False)["input_ids"]) < len(p) for p in PROMPTS)
    rng = random.Random(1)
    answers = {cls().generate(rng)[1] for cls in BUILTIN_TASKS.values() for _ in range(50)}
    assert all(len(tok(a, add_special_tokens=False)["input_ids"]) == 1 for a in answers | set(CHARACTERS))
    assert recommended_defaults("tiny-bpe").max_new_tokens == 1  # room for any built-in answer
    assert 1 < max_token_chars(tok) <= 16
    # a one-token completion, once decoded, is one token again: within the node's own budget when it trains
    special = set(SPECIAL_TOKENS)
    assert all(tok.tokenize(t) == [t] for t in tok.get_vocab() if t not in special)


def test_builds_give_one_vocabulary() -> None:
    a, b = bpe_tokenizer(), bpe_tokenizer()
    assert a is not b and a.get_vocab() == b.get_vocab()
    _bpe_core_json.cache_clear()  # train again, not the cached result
    assert bpe_tokenizer().backend_tokenizer.to_str() == a.backend_tokenizer.to_str()


@pytest.mark.process
def test_another_process_trains_the_same_vocabulary() -> None:
    """Nodes of tiny-bpe average weights by token id: every process (any hash seed) must train one vocabulary."""
    a = bpe_tokenizer()
    code = "from node.training.tokenizer import bpe_tokenizer; print(bpe_tokenizer().backend_tokenizer.to_str())"
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": "7"}
    )
    assert other.stdout.strip() == a.backend_tokenizer.to_str()


def test_saved_tokenizer_loads_with_plain_transformers(tmp_path: Path) -> None:
    built = bpe_tokenizer()
    built.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    for text in [*PROMPTS, "x\ny  1"]:
        assert loaded(text)["input_ids"] == built(text)["input_ids"]
        assert loaded.decode(built(text)["input_ids"], skip_special_tokens=True) == text
    assert loaded.get_vocab() == built.get_vocab() and loaded.padding_side == "left"


def test_model_covers_the_vocabulary_and_differs_from_the_character_models(policy: Policy) -> None:
    model, tok = policy.model, policy.tokenizer
    assert policy.model_id == "tiny-bpe" and model.config.vocab_size == len(tok) == BPE_VOCAB_SIZE
    assert max(tok.get_vocab().values()) < model.config.vocab_size
    assert 200_000 <= sum(p.numel() for p in model.parameters()) <= 400_000
    same, _, _ = load_model("tiny-bpe", seed=0, device="cpu")
    assert all(torch.equal(x, y) for x, y in zip(model.parameters(), same.parameters(), strict=True))
    char_model, _, _ = load_model("tiny-s", seed=0, device="cpu")
    assert char_model.config.vocab_size == len(char_tokenizer()) != BPE_VOCAB_SIZE


def test_generation_and_a_grpo_step(policy: Policy) -> None:
    tok = policy.tokenizer
    out = policy.generate(PROMPTS[:2], 4, GenerationConfig(max_new_tokens=3), seed=0)
    assert len(out) == 2 and all(len(c) == 4 for c in out)
    # three tokens hold more than three characters (re-tokenised, they need not be the three sampled)
    assert all(len(t) <= 3 * max_token_chars(tok) for c in out for t in c)
    one = policy.generate(PROMPTS[:2], 4, GenerationConfig(max_new_tokens=1), seed=0)
    assert all(len(tok(t, add_special_tokens=False)["input_ids"]) == 1 for c in one for t in c)
    ref = TaskRef.make("max", {"digits": 4}, 0, 0)
    group = TrainGroup("max 3941=", ("9", "94", " 3"), (1.0, 0.0, 0.0), "peer", "max", ref)  # "94": one token
    with torch.no_grad():
        before, _ = policy.token_logprobs([group.prompt] * 3, list(group.completions))
    stats = GRPOTrainer(policy, GRPOConfig(learning_rate=1e-2)).step([group])
    assert stats["n_groups"] == 1 and stats["n_completions"] == 3 and math.isfinite(stats["loss"])
    with torch.no_grad():
        after, _ = policy.token_logprobs([group.prompt] * 3, list(group.completions))
    assert after[0, 0] > before[0, 0]  # "9" was rewarded
