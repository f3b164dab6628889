"""The shared warm start: the same prior on every node, cached without being trusted blindly."""

from __future__ import annotations

from pathlib import Path

import torch

from node.tasks.registry import build_task
from node.training.adapters import SHARED_BASE_SEED
from node.training.device import params_digest
from node.training.evaluate import EvalConfig, eval_sets, evaluate
from node.training.models import load_model
from node.training.policy import GenerationConfig, Policy
from node.training.warmstart import cache_key, warm_start

FAMILIES = {n: build_task(n) for n in ("max", "min")}


def _policy() -> Policy:
    model, tok, mid = load_model("tiny-s", seed=SHARED_BASE_SEED, device="cpu")
    return Policy(model, tok, mid)


def test_two_nodes_compute_the_same_prior_whatever_their_thread_count() -> None:
    threads = torch.get_num_threads()
    a, b = _policy(), _policy()
    init = params_digest(a.model)
    torch.set_num_threads(2)
    warm_start(a, FAMILIES, 30, cache_dir=None)
    torch.set_num_threads(1)
    warm_start(b, FAMILIES, 30, cache_dir=None)
    torch.set_num_threads(threads)
    assert params_digest(a.model) == params_digest(b.model) != init
    assert torch.get_num_threads() == threads


def test_the_prior_answers_more_held_out_questions_than_the_initial_weights() -> None:
    policy = _policy()
    sets = eval_sets(FAMILIES, 64)
    cfg = EvalConfig(eval_samples=0)
    before = evaluate(policy, FAMILIES, sets, GenerationConfig(max_new_tokens=1), cfg).accuracy
    warm_start(policy, FAMILIES, 60, cache_dir=None)
    after = evaluate(policy, FAMILIES, sets, GenerationConfig(max_new_tokens=1), cfg).accuracy
    assert after > before + 0.1


def test_a_cached_prior_is_the_computed_one_and_a_torn_cache_is_recomputed(tmp_path: Path) -> None:
    first = _policy()
    key = cache_key(first, FAMILIES, 20)
    warm_start(first, FAMILIES, 20, cache_dir=tmp_path)
    assert (tmp_path / f"{key}.pt").is_file()
    second = _policy()
    warm_start(second, FAMILIES, 20, cache_dir=tmp_path)
    assert params_digest(second.model) == params_digest(first.model)
    (tmp_path / f"{key}.pt").write_bytes(b"not a tensor file")
    third = _policy()
    warm_start(third, FAMILIES, 20, cache_dir=tmp_path)
    assert params_digest(third.model) == params_digest(first.model)


def test_another_model_or_step_count_is_another_cache_entry() -> None:
    p = _policy()
    assert cache_key(p, FAMILIES, 20) != cache_key(p, FAMILIES, 21)
    assert cache_key(p, FAMILIES, 20) != cache_key(p, {"max": FAMILIES["max"]}, 20)
    model, tok, mid = load_model("tiny-s", seed=1, device="cpu")
    assert cache_key(Policy(model, tok, mid), FAMILIES, 20) != cache_key(p, FAMILIES, 20)
