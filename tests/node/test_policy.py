"""Tokenizer, model registry and policy: round trips, determinism, log-probs against a manual computation."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from node.training.models import BUILTIN_MODELS, ModelNotFound, load_model
from node.training.policy import GenerationConfig, Policy
from node.training.tokenizer import CHARACTERS, char_tokenizer, max_token_chars
from swarm.fingerprint import model_fingerprint

PROMPTS = ["max 3941=", "a", "count7 37719="]


@pytest.fixture(scope="module")
def policy() -> Policy:
    torch.set_num_threads(1)
    model, tok, model_id = load_model("tiny-s", seed=0, device="cpu")
    return Policy(model, tok, model_id)


# --- tokenizer --------------------------------------------------------------------------------


def test_char_tokenizer_round_trip_and_save(tmp_path: Path) -> None:
    tok = char_tokenizer()
    ids = tok(CHARACTERS, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(CHARACTERS) and len(set(ids)) == len(CHARACTERS)  # one token per character
    assert tok.decode(ids) == CHARACTERS
    with_bos = tok("max 12=")["input_ids"]
    assert with_bos[0] == tok.bos_token_id and tok.decode(with_bos, skip_special_tokens=True) == "max 12="
    assert tok("é", add_special_tokens=False)["input_ids"] == [tok.unk_token_id]
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    assert (
        again("x\ny 1", add_special_tokens=False)["input_ids"] == tok("x\ny 1", add_special_tokens=False)["input_ids"]
    )
    assert (again.pad_token_id, again.eos_token_id) == (tok.pad_token_id, tok.eos_token_id)


def test_max_token_chars_bounds_the_characters_of_a_token_budget(policy: Policy) -> None:
    tok = char_tokenizer()
    assert max_token_chars(tok) == 1  # "<eos>" and the other special tokens do not count
    text = "max 3941= count7 \n"
    assert policy.count_completion_tokens(text) == len(text) <= 1 * len(text)
    assert policy.count_prompt_tokens("max 1=") == len("max 1=") + 1  # <bos>
    assert policy.count_completion_tokens("") == 0


# --- models -----------------------------------------------------------------------------------


def test_builtin_models_deterministic_and_distinct() -> None:
    fingerprints = set()
    for name in BUILTIN_MODELS:
        model, _tok, model_id = load_model(name, seed=1, device="cpu")
        n = sum(p.numel() for p in model.parameters())
        assert 50_000 <= n <= 2_000_000 and model_id == name
        fingerprints.add(model_fingerprint(model))
    assert len(fingerprints) == len(BUILTIN_MODELS)
    a, _, _ = load_model("tiny-s", seed=5, device="cpu")
    b, _, _ = load_model("tiny-s", seed=5, device="cpu")
    c, _, _ = load_model("tiny-s", seed=6, device="cpu")
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a.parameters(), c.parameters(), strict=True))
    assert model_fingerprint(a) == model_fingerprint(c)
    assert re.fullmatch(r"[0-9a-f]{16}", model_fingerprint(a))


def test_model_not_found_lists_valid_names() -> None:
    with pytest.raises(ModelNotFound) as err:
        load_model("tiny-xxl", seed=0, device="cpu")
    assert all(name in str(err.value) for name in BUILTIN_MODELS)


def test_load_local_folder(tmp_path: Path, policy: Policy) -> None:
    policy.model.save_pretrained(tmp_path / "my-model")
    policy.tokenizer.save_pretrained(tmp_path / "my-model")
    model, tok, model_id = load_model(str(tmp_path / "my-model"), seed=123, device="cpu")
    assert model_id == "my-model"
    assert all(torch.equal(x, y) for x, y in zip(model.parameters(), policy.model.parameters(), strict=True))
    assert tok.padding_side == "left" and tok.pad_token_id is not None


# --- generation -------------------------------------------------------------------------------


def test_generate_shapes_and_determinism(policy: Policy) -> None:
    cfg = GenerationConfig(max_new_tokens=5)
    out = policy.generate(PROMPTS, 4, cfg, seed=11)
    assert len(out) == 3 and all(len(c) == 4 for c in out)
    assert all(isinstance(t, str) and len(t) <= 5 for c in out for t in c)
    assert policy.generate(PROMPTS, 4, cfg, seed=11) == out
    gen = torch.Generator().manual_seed(11)
    assert policy.generate(PROMPTS, 4, cfg, seed=gen) == out
    assert policy.generate(PROMPTS, 4, cfg, seed=12) != out


def test_batched_greedy_generation_equals_one_by_one(policy: Policy) -> None:
    """Left padding, position ids and the KV cache make a row's output independent of the batch."""
    cfg = GenerationConfig(temperature=0.0, max_new_tokens=3)
    outs = [c[0] for c in policy.generate(PROMPTS, 1, cfg)]
    singles = [policy.generate([p], 1, cfg)[0][0] for p in PROMPTS]
    assert outs == singles  # batching with padding changes nothing


def test_generation_config_validation() -> None:
    for bad in (dict(temperature=-1.0), dict(top_p=0.0), dict(top_p=1.5), dict(max_new_tokens=0)):
        with pytest.raises(ValueError):
            GenerationConfig(**bad)
    assert GenerationConfig(top_p=0.5, temperature=0.7).top_p == 0.5


def test_top_p_keeps_only_the_nucleus(policy: Policy) -> None:
    cfg = GenerationConfig(top_p=1e-6, max_new_tokens=3)  # only the top token survives: greedy
    greedy = policy.generate(PROMPTS, 1, GenerationConfig(temperature=0.0, max_new_tokens=3))
    assert policy.generate(PROMPTS, 1, cfg, seed=3) == greedy


# --- log-probs --------------------------------------------------------------------------------


def _manual_logprobs(policy: Policy, prompt: str, completion: str) -> torch.Tensor:
    p_ids = policy.tokenizer(prompt)["input_ids"]  # <bos> + characters
    c_ids = policy.tokenizer(completion, add_special_tokens=False)["input_ids"] + [policy.tokenizer.eos_token_id]
    ids = torch.tensor([p_ids + c_ids])
    with torch.no_grad():
        logp = torch.log_softmax(policy.model(input_ids=ids).logits[0].float(), dim=-1)
    return torch.stack([logp[len(p_ids) - 1 + j, t] for j, t in enumerate(c_ids)])


def test_token_logprobs_match_manual_gather(policy: Policy) -> None:
    completions = ["9", "hello", ""]
    logp, mask = policy.token_logprobs(PROMPTS, completions)
    assert logp.shape == mask.shape == (3, 6)  # longest completion "hello" + eos
    assert logp.requires_grad
    assert mask.tolist() == [[1, 1, 0, 0, 0, 0], [1] * 6, [1, 0, 0, 0, 0, 0]]
    for i, (p, c) in enumerate(zip(PROMPTS, completions, strict=True)):
        manual = _manual_logprobs(policy, p, c)
        assert torch.allclose(logp[i, : len(manual)].detach(), manual, atol=1e-5)
        assert torch.all(logp[i, len(manual) :] == 0)


def test_never_samples_an_id_past_the_tokenizers_vocabulary() -> None:
    """A padded output layer (more logits than tokens, as Qwen2.5's) must not yield undecodable ids."""
    model, tok, model_id = load_model("tiny-s", seed=0, device="cpu")
    n = len(tok)
    model.resize_token_embeddings(n + 32)
    bonus = torch.zeros(n + 32)
    bonus[n:] = 100.0  # the padded ids would win every draw
    model.get_output_embeddings().register_forward_hook(lambda module, args, out: out + bonus)
    policy = Policy(model, tok, model_id)
    comps = policy.generate(["max 1234="], 16, GenerationConfig(max_new_tokens=3), seed=0)[0]
    assert all(comps), "an id past the vocabulary decodes to nothing"


@pytest.mark.parametrize("name,adapter", [("tiny-m", False), ("tiny-gpt2", False), ("tiny-m", True)])
def test_rows_that_share_a_prompt_pass_it_once_with_the_same_logprobs_and_gradients(name: str, adapter: bool) -> None:
    from node.training.adapters import AdapterConfig, attach_adapter

    model, tok, mid = load_model(name, seed=0, device="cpu")
    if adapter:
        model = attach_adapter(model, AdapterConfig(adapter="lora", lora_rank=4), seed=0)
    policy = Policy(model, tok, mid, "cpu")
    prompts = ["max 3941="] * 3 + ["min 27="] * 2 + ["pos 5512=", "max 3941="]
    completions = ["9", "12", "3", "7", "", "abc", "44"]
    got = {}
    for shared in (False, True):
        policy.share_prefill = shared
        model.zero_grad()
        before = policy.meter.scored
        logp, mask = policy.token_logprobs(prompts, completions)
        logp.sum().backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        got[shared] = (logp.detach(), mask, grads, policy.meter.scored - before)
    (lp0, m0, g0, n0), (lp1, m1, g1, n1) = got[False], got[True]
    assert torch.equal(m0, m1) and torch.allclose(lp0, lp1, atol=1e-5)
    assert torch.allclose(g0, g1, atol=1e-5 * float(g0.abs().max()))
    # runs of 3, 2, 1 and 1 rows: the first passes its prompt twice less, the second once (the last row's
    # prompt is the first's, but not adjacent to it: it passes again)
    saved = 2 * len(policy.encode_prompt("max 3941=")) + len(policy.encode_prompt("min 27="))
    assert n1 == n0 - saved
