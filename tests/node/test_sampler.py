"""The node's sampler: one prefill per prompt, a low-precision copy that follows training, claims off the sampler."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from node.training.models import load_model
from node.training.policy import GenerationConfig, Policy, sample_next
from node.training.sampler import (
    LowPrecisionCopy,
    TokenLimits,
    cpu_has_native_bf16,
    sample_tokens,
    sampling_dtype,
)

PROMPTS = ["max 3941=", "min 27=", "pos 5512=", "count 7007="]


def tiny(name: str = "tiny-m") -> Policy:
    model, tok, mid = load_model(name, seed=0, device="cpu")
    return Policy(model, tok, mid, "cpu")


def gqa_llama() -> Any:
    """A small Llama whose 4 query heads share 2 key/value heads (SmolLM2 and Qwen2 are grouped)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, eos_token_id=1, bos_token_id=2,
    )  # fmt: skip
    return LlamaForCausalLM(cfg).eval()


def limits(policy: Policy, eos: int | None = None) -> TokenLimits:
    return TokenLimits(policy._banned, policy.vocab_size, policy.eos_id if eos is None else eos, policy.pad_id)


@pytest.mark.parametrize("name", ["tiny-m", "tiny-gpt2"])
def test_one_prefill_per_prompt_draws_what_one_prefill_per_row_draws(name: str) -> None:
    policy = tiny(name)
    cfg = GenerationConfig(max_new_tokens=6)
    prompts = [policy.encode_prompt(p) for p in PROMPTS]

    def run(shared: bool) -> torch.Tensor:
        gen = torch.Generator().manual_seed(5)
        rows = prompts if shared else [p for p in prompts for _ in range(3)]
        out = sample_tokens(
            policy.model, rows, 3 if shared else 1, 6, lambda z: sample_next(z, cfg, gen), limits(policy, eos=-1)
        )
        return out.ids

    assert torch.equal(run(shared=True), run(shared=False))


def test_the_same_seed_gives_the_same_completions_in_either_precision() -> None:
    policy = tiny()
    for precision in ("float32", "bfloat16"):
        cfg = GenerationConfig(max_new_tokens=4, sample_precision=precision)
        first = policy.generate(PROMPTS, 5, cfg, seed=11)
        assert policy.generate(PROMPTS, 5, cfg, seed=11) == first
        assert [len(row) for row in first] == [5] * len(PROMPTS)


@pytest.mark.parametrize("rows", [4, 12])  # one prompt's 6 rows in batches of 4 and 2; two prompts a batch
def test_batches_smaller_than_a_round_keep_each_prompts_rows_together(rows: int) -> None:
    policy = tiny("tiny-bpe")  # multi-token answers: a row's text shows which prompt it continued
    cfg = GenerationConfig(max_new_tokens=3, temperature=0.0)
    whole = policy.generate(PROMPTS, 6, cfg)
    policy.max_batch_rows = rows
    split = policy.generate(PROMPTS, 6, cfg)
    assert split == whole and all(len(set(r)) == 1 for r in split)  # greedy: batching changes no draw


def test_grouped_attention_computes_what_the_models_own_attention_computes() -> None:
    model = gqa_llama()
    copy = LowPrecisionCopy(model, torch.float32).get()
    assert copy.config._attn_implementation == "swarm_grouped"
    ids = torch.randint(3, 60, (3, 9))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # a left-padded row
    with torch.no_grad():
        a, b = (
            model(input_ids=ids, attention_mask=mask, use_cache=True),
            copy(input_ids=ids, attention_mask=mask, use_cache=True),
        )
        assert torch.allclose(a.logits[1:], b.logits[1:], atol=1e-5)
        assert torch.allclose(a.logits[0, 3:], b.logits[0, 3:], atol=1e-5)
        step = torch.tensor([[5], [6], [7]])
        longer = torch.cat([mask, torch.ones((3, 1), dtype=mask.dtype)], dim=1)
        da = model(input_ids=step, attention_mask=longer, past_key_values=a.past_key_values).logits
        db = copy(input_ids=step, attention_mask=longer, past_key_values=b.past_key_values).logits
    assert torch.allclose(da, db, atol=1e-5)


def test_the_low_precision_copy_samples_with_the_weights_as_trained_now() -> None:
    policy = tiny()
    low = LowPrecisionCopy(policy.model, torch.bfloat16)
    ids = torch.tensor([policy.encode_prompt(PROMPTS[0])])
    with torch.no_grad():
        before = low.get()(input_ids=ids).logits.float()
    opt = torch.optim.SGD(policy.model.parameters(), lr=0.5)
    logp, _ = policy.token_logprobs([PROMPTS[0]], ["7"])
    (-(logp.sum())).backward()
    opt.step()  # an in-place update of every trained weight, as the node's optimiser makes
    with torch.no_grad():
        want = policy.model(input_ids=ids).logits
        got = low.get()(input_ids=ids).logits.float()
    assert (got - want).abs().max() < 0.05 * want.abs().max()  # bf16 of the new weights
    assert (got - before).abs().max() > 10 * (got - want).abs().max()  # and not the old ones


@pytest.mark.parametrize("name", ["tiny-m", "tiny-gpt2"])  # GPT-2's Conv1D stores its weight transposed
def test_an_adapter_is_merged_into_the_copy_as_it_is_now(name: str) -> None:
    from node.training.adapters import AdapterConfig, attach_adapter

    model, _, _ = load_model(name, seed=0, device="cpu")
    wrapped = attach_adapter(model, AdapterConfig(adapter="lora", lora_rank=4), seed=0)
    low = LowPrecisionCopy(wrapped, torch.float32)
    ids = torch.randint(3, 30, (2, 7))
    with torch.no_grad():
        for p in wrapped.parameters():
            if p.requires_grad:  # lora_B starts at 0: give the adapter a delta, as training would
                p.add_(0.05 * torch.randn_like(p))
        got, want = low.get()(input_ids=ids).logits, wrapped(input_ids=ids).logits
    assert not hasattr(low.get(), "peft_config")  # a plain model: no low-rank products per step
    assert torch.allclose(got, want, atol=1e-4)
    with torch.no_grad():
        for p in wrapped.parameters():
            if p.requires_grad:
                p.mul_(-1.0)
        assert torch.allclose(low.get()(input_ids=ids).logits, wrapped(input_ids=ids).logits, atol=1e-4)


def test_claims_off_the_sampler_are_what_a_scoring_pass_gives() -> None:
    policy = tiny()
    cfg = GenerationConfig(max_new_tokens=8, sample_precision="float32")
    out = policy.sample(PROMPTS, 16, cfg, seed=2)
    pairs = [(p, c) for p, row in zip(PROMPTS, out, strict=True) for c in row]
    claimed = [(p, c) for p, c in pairs if c.logprob is not None]
    assert claimed and len(claimed) < len(pairs)  # rows cut at max_new_tokens have none
    finished = policy.sample(PROMPTS, 16, cfg, seed=2, claims=True)  # one more step for them: every row has one
    assert [[c.text for c in row] for row in finished] == [[c.text for c in row] for row in out]
    assert all(c.logprob is not None for row in finished for c in row)
    claimed = [(p, c) for p, row in zip(PROMPTS, finished, strict=True) for c in row]
    scored = policy.sequence_logprobs([p for p, _ in claimed], [c.text for _, c in claimed])
    for (_, c), s in zip(claimed, scored, strict=True):
        assert c.logprob == pytest.approx(s, abs=1e-4)


def test_inverse_cdf_draws_follow_the_distribution_and_never_a_banned_token() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, float("-inf"), -1.0]]).repeat(20_000, 1)
    gen = torch.Generator().manual_seed(0)
    drawn = sample_next(logits, GenerationConfig(), gen)
    freq = torch.bincount(drawn, minlength=5).float() / len(drawn)
    assert freq[3] == 0
    assert torch.allclose(freq, torch.softmax(logits[0], -1), atol=0.01)
    top = sample_next(logits, GenerationConfig(top_p=0.7), torch.Generator().manual_seed(0))
    assert set(top.tolist()) == {0, 1}  # 0.64 + 0.24: the smallest set with 0.7 of the mass


def test_auto_precision_takes_bf16_only_where_it_is_fast_and_measured(tmp_path: Path) -> None:
    cpu, big = torch.device("cpu"), 100_000_000
    assert sampling_dtype("auto", cpu, big, adapted=True, native_bf16=True) is torch.bfloat16
    assert sampling_dtype("auto", cpu, big, adapted=False, native_bf16=True) is None  # full fine-tuning
    assert sampling_dtype("auto", cpu, big, adapted=True, native_bf16=False) is None
    assert sampling_dtype("auto", cpu, 1_000_000, adapted=True, native_bf16=True) is None  # a tiny model
    assert sampling_dtype("bfloat16", cpu, 10, adapted=False, native_bf16=False) is torch.bfloat16
    assert sampling_dtype("bfloat16", torch.device("cuda"), big, adapted=True, native_bf16=True) is None
    with pytest.raises(ValueError, match="precision"):
        GenerationConfig(sample_precision="fp8")
    flags = tmp_path / "cpuinfo"
    flags.write_text("processor : 0\nflags : fpu avx2 avx512f avx512_bf16\n")
    assert cpu_has_native_bf16(str(flags))
    older = tmp_path / "cpuinfo-older"  # a path is read once per process
    older.write_text("processor : 0\nflags : fpu avx2 avx512f\n")
    assert not cpu_has_native_bf16(str(older))
    assert not cpu_has_native_bf16(str(tmp_path / "missing"))


def test_a_stop_before_sampling_returns_empty_rows() -> None:
    policy = tiny()
    policy.stop = lambda: True
    assert policy.generate(PROMPTS[:2], 3, GenerationConfig(max_new_tokens=4), seed=0) == [["", "", ""], ["", "", ""]]


def test_the_meter_counts_sampled_and_scored_tokens() -> None:
    policy = tiny()
    out = policy.sample(PROMPTS, 2, GenerationConfig(max_new_tokens=1), seed=0)
    assert policy.meter.sampled == sum(1 for row in out for _ in row)  # one token each (eos or not)
    assert policy.meter.sample_s > 0
    policy.token_logprobs(PROMPTS[:1], ["7"])
    assert policy.meter.scored == len(policy.encode_prompt(PROMPTS[0])) + 2


def test_a_row_whose_text_tokenises_otherwise_or_that_was_cut_gets_no_claim() -> None:
    policy = tiny("tiny-bpe")
    prompt = policy.encode_prompt(PROMPTS[0])
    ids = policy.encode_completion("12")  # the text's own ids, then eos
    other = [*(policy.tokenizer.convert_tokens_to_ids(list("12"))), policy.eos_id]  # one id per character
    assert ids != other, "the BPE should merge '12' into one token"
    logp = [-0.5] * len(other)
    assert policy._claim(prompt, ids, logp, "12", 8, True) == pytest.approx(-0.5 * len(ids))
    assert policy._claim(prompt, other, logp, "12", 8, True) is None  # the receiver would score other ids
    assert policy._claim(prompt, ids[:-1], logp, "12", 8, False) is None  # cut, no eos measured after it
    assert policy._claim(prompt, ids[:-1], logp, "12", 8, -2.0) == pytest.approx(-0.5 * (len(ids) - 1) - 2.0)
