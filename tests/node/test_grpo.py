"""GRPO: advantages, zero-advantage dropping, the clipped loss against hand-computed numbers, the trainer."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from node.tasks.verify import TrainGroup
from node.training.grpo import GRPOConfig, GRPOTrainer, LossNorm, drop_zero_advantage, group_advantages, grpo_loss
from node.training.models import load_model
from node.training.policy import Policy, SequenceTooLong
from protocol.schema import TaskRef

REF = TaskRef.make("max", {"digits": 4}, 0, 0)


def _group(rewards: list[float], completions: list[str] | None = None, prompt: str = "max 1234=") -> TrainGroup:
    comps = completions or [str(i % 10) for i in range(len(rewards))]
    return TrainGroup(prompt, tuple(comps), tuple(rewards), "peer", "max", REF)


# --- advantages ----------------------------------------------------------------------------


def test_group_advantages_hand_computed() -> None:
    # rewards [1,0,0,0]: mean 0.25, sample std sqrt((0.5625 + 3 * 0.0625) / 3) = 0.5
    assert group_advantages([1.0, 0.0, 0.0, 0.0], scale=False) == pytest.approx([0.75, -0.25, -0.25, -0.25])
    expected = [0.75 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001]
    assert group_advantages([1.0, 0.0, 0.0, 0.0], scale=True) == pytest.approx(expected, rel=1e-9)
    assert group_advantages([0.5, 0.5, 0.5]) == [0.0, 0.0, 0.0]
    assert sum(group_advantages([0.3, 0.9, 0.1, 1.0])) == pytest.approx(0.0, abs=1e-12)


def test_drop_zero_advantage() -> None:
    groups = [_group([1, 1, 1]), _group([0, 1, 0]), _group([0, 0, 0]), _group([0.5, 0.5, 0.25])]
    kept, dropped = drop_zero_advantage(groups)
    assert kept == [groups[1], groups[3]]
    assert dropped == 2


# --- the loss, against numbers computed by hand -----------------------------------------
# Two completions, old log-probs 0, so ratio r = exp(logp):
#   row 0, A=+1, mask [1,1,0]: r = 1.5 (clipped at 1.28: term 1.28, no grad), r = 0.5 (term 0.5)
#   row 1, A=-2, mask [1,1,1]: r = 0.5 (clipped at 0.8: term -1.6, no grad), r = 1.1 (-2.2), r = 1.0 (-2.0)
# token losses (-term): row 0 [-1.28, -0.5], row 1 [1.6, 2.2, 2.0]; sum 4.02 over 5 tokens.
# d loss_token / d logp = -r*A where unclipped: row 0 [0, -0.5, 0], row 1 [0, 2.2, 2.0].

RATIOS = [[1.5, 0.5, 3.0], [0.5, 1.1, 1.0]]  # the 3.0 is masked out
MASK = [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    logp = torch.tensor(RATIOS, dtype=torch.float64).log().requires_grad_(True)
    return (
        logp,
        torch.zeros(2, 3, dtype=torch.float64),
        torch.tensor([1.0, -2.0], dtype=torch.float64),
        torch.tensor(MASK, dtype=torch.float64),
    )


@pytest.mark.parametrize(
    ("loss_type", "value", "grad"),
    [
        ("bnpo", 4.02 / 5, [[0.0, -0.5 / 5, 0.0], [0.0, 2.2 / 5, 2.0 / 5]]),
        ("grpo", (-1.78 / 2 + 5.8 / 3) / 2, [[0.0, -0.5 / 4, 0.0], [0.0, 2.2 / 6, 2.0 / 6]]),
        ("dr_grpo", 4.02 / 6, [[0.0, -0.5 / 6, 0.0], [0.0, 2.2 / 6, 2.0 / 6]]),
    ],
)
def test_grpo_loss_and_gradient_by_hand(loss_type: str, value: float, grad: list[list[float]]) -> None:
    logp, old, adv, mask = _inputs()
    cfg = GRPOConfig(epsilon=0.2, epsilon_high=0.28, loss_type=loss_type)
    loss = grpo_loss(logp, old, adv, mask, cfg)
    assert loss.item() == pytest.approx(value, abs=1e-12)
    loss.backward()
    assert logp.grad is not None
    assert torch.allclose(logp.grad, torch.tensor(grad, dtype=torch.float64), atol=1e-12)


def test_grpo_loss_micro_batches_sum_to_full_batch() -> None:
    logp, old, adv, mask = _inputs()
    for loss_type in ("bnpo", "grpo", "dr_grpo"):
        cfg = GRPOConfig(loss_type=loss_type)
        full = grpo_loss(logp, old, adv, mask, cfg)
        norm = LossNorm.of(mask)
        parts = []
        for i in range(2):  # row i alone, trimmed to its own width 2 + i
            rows, cols = slice(i, i + 1), slice(0, 2 + i)
            parts.append(grpo_loss(logp[rows, cols], old[rows, cols], adv[rows], mask[rows, cols], cfg, norm=norm))
        assert (parts[0] + parts[1]).item() == pytest.approx(full.item(), abs=1e-12)


def test_kl_term_by_hand() -> None:
    # beta=0.1, A=0, logp=0, ref=ln 2: k3 = e^(ref-logp) - (ref-logp) - 1 = 1 - ln 2; d/dlogp = 1 - e^(ref-logp) = -1
    logp = torch.zeros(1, 1, dtype=torch.float64, requires_grad=True)
    ref = torch.full((1, 1), math.log(2.0), dtype=torch.float64)
    cfg = GRPOConfig(beta=0.1)
    loss = grpo_loss(
        logp,
        logp.detach(),
        torch.zeros(1, dtype=torch.float64),
        torch.ones(1, 1, dtype=torch.float64),
        cfg,
        ref_logp=ref,
    )
    assert loss.item() == pytest.approx(0.1 * (1 - math.log(2.0)), abs=1e-12)
    loss.backward()
    assert logp.grad is not None and logp.grad.item() == pytest.approx(-0.1, abs=1e-12)
    with pytest.raises(ValueError):
        grpo_loss(logp, logp.detach(), torch.zeros(1), torch.ones(1, 1), cfg)


@pytest.mark.parametrize(
    "bad",
    [dict(learning_rate=0.0), dict(epsilon=1.5), dict(num_iterations=0), dict(loss_type="ppo"), dict(beta=-1.0)],
)
def test_config_validation(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        GRPOConfig(**bad)  # type: ignore[arg-type]


# --- the trainer ------------------------------------------------------------------------------


def _policy(seed: int = 0) -> Policy:
    model, tok, model_id = load_model("tiny-s", seed=seed, device="cpu")
    return Policy(model, tok, model_id)


def _params(policy: Policy) -> list[torch.Tensor]:
    return [p.detach().clone() for p in policy.model.parameters()]


def test_trainer_skips_zero_advantage_batches() -> None:
    policy = _policy()
    before = _params(policy)
    stats = GRPOTrainer(policy).step([_group([0.0] * 4), _group([1.0] * 4)])
    assert stats["n_groups"] == 0 and stats["n_dropped"] == 2 and stats["n_completions"] == 0
    assert all(torch.equal(a, b) for a, b in zip(before, _params(policy), strict=True))


def test_trainer_skips_and_counts_groups_past_the_context_on_a_gpt2_position_table() -> None:
    """A completion of 255+ tokens leaves no room in tiny-gpt2's 256 positions: skipped, never an IndexError."""
    model, tok, model_id = load_model("tiny-gpt2", seed=0, device="cpu")
    policy = Policy(model, tok, model_id)
    assert policy.max_length == 256 and policy.fits("9" * 254) and not policy.fits("9" * 255)
    too_long, fine = _group([1.0, 0.0], completions=["7", "9" * 1000]), _group([1.0, 0.0], completions=["7", "3"])
    with pytest.raises(SequenceTooLong, match="1001 tokens; context 256"):
        policy.token_logprobs([too_long.prompt] * 2, list(too_long.completions))
    before = _params(policy)

    stats = GRPOTrainer(policy).step([too_long, fine])

    assert stats["n_too_long"] == 1 and stats["n_groups"] == 1 and stats["n_completions"] == 2
    assert not all(torch.equal(a, b) for a, b in zip(before, _params(policy), strict=True))
    only_long = GRPOTrainer(policy).step([too_long])
    assert only_long["n_too_long"] == 1 and only_long["n_groups"] == 0


def test_trainer_step_moves_probability_towards_rewarded_completion() -> None:
    policy = _policy()
    group = _group([1.0, 0.0], completions=["7", "3"])
    with torch.no_grad():
        before, _ = policy.token_logprobs([group.prompt] * 2, ["7", "3"])
    trainer = GRPOTrainer(policy, GRPOConfig(learning_rate=1e-2))
    stats = trainer.step([group, _group([1.0, 1.0])])
    assert stats["n_groups"] == 1 and stats["n_dropped"] == 1 and stats["n_completions"] == 2
    assert stats["grad_norm"] > 0 and math.isfinite(stats["loss"]) and stats["clip_frac"] == 0.0
    with torch.no_grad():
        after, _ = policy.token_logprobs([group.prompt] * 2, ["7", "3"])
    assert after[0, 0] > before[0, 0]  # "7" was rewarded
    assert after[1, 0] < before[1, 0]  # "3" was not


def _step_gradients(trainer: GRPOTrainer, groups: list[TrainGroup]) -> list[torch.Tensor]:
    """The gradients of one trainer step, captured at the optimiser step (the trainer frees them after it).

    Gradients, not weights, are compared: Adam's first step is ~lr * sign(grad), which amplifies rounding noise.
    """
    captured: list[torch.Tensor] = []
    step = trainer.optimizer.step
    params = list(trainer.policy.model.parameters())

    def capture(*a: Any, **k: Any) -> Any:
        captured.extend(p.grad.clone() for p in params if p.grad is not None)
        return step(*a, **k)

    trainer.optimizer.step = capture  # type: ignore[method-assign]
    trainer.step(groups)
    return captured


def test_micro_batching_gives_the_same_update() -> None:
    groups = [_group([1.0, 0.0, 0.0], ["9", "12", "x y"]), _group([0.0, 1.0], ["", "5"], prompt="min 5678=")]
    grads = []
    for mb in (1, 64):
        policy = _policy(seed=3)
        trainer = GRPOTrainer(policy, GRPOConfig(micro_batch_size=mb, max_grad_norm=0.0))
        grads.append(_step_gradients(trainer, groups))
    assert len(grads[0]) == len(grads[1]) > 0
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-7) for a, b in zip(*grads, strict=True))


def test_multiple_iterations_and_kl_run() -> None:
    policy = _policy()
    cfg = GRPOConfig(num_iterations=3, beta=0.05, learning_rate=5e-2)
    stats = GRPOTrainer(policy, cfg).step([_group([1.0, 0.0, 0.0, 1.0], ["1", "2", "3", "4"])])
    assert stats["n_completions"] == 4 and math.isfinite(stats["loss"])
    assert 0.0 <= stats["clip_frac"] <= 1.0


def test_gradient_checkpointing_gives_the_same_gradients_and_leaves_eval_mode() -> None:
    groups = [_group([1.0, 0.0, 0.0], ["9", "12", "x y"]), _group([0.0, 1.0], ["", "5"], prompt="min 5678=")]
    grads = []
    for ckpt in (False, True):
        policy = _policy(seed=3)
        trainer = GRPOTrainer(policy, GRPOConfig(max_grad_norm=0.0, gradient_checkpointing=ckpt))
        grads.append(_step_gradients(trainer, groups))
        assert not policy.model.training  # generation keeps eval mode
    assert len(grads[0]) == len(grads[1]) > 0
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(*grads, strict=True))
