"""The learning-rate schedule: its shapes, the trainer's use of it, a node's record and resume, the CLI's checks."""

from __future__ import annotations

import itertools
import math

import pytest

from node.core.assemble import node_configs
from node.core.options import NodeOptions
from node.tasks.verify import TrainGroup
from node.training.grpo import GRPOConfig, GRPOTrainer
from node.training.models import load_model
from node.training.policy import Policy
from node.training.schedule import LR_SCHEDULES, scheduled_lr
from protocol.schema import TaskRef

REF = TaskRef.make("max", {"digits": 4}, 0, 0)


def test_linear_and_cosine_fall_from_the_rate_to_the_floor_then_hold() -> None:
    for shape in ("linear", "cosine"):
        rates = [scheduled_lr(6e-4, shape, 150, 0.5, done) for done in range(0, 200)]
        assert rates[0] == 6e-4 and rates[150] == pytest.approx(3e-4) and set(rates[150:]) == {rates[150]}
        assert all(a >= b for a, b in itertools.pairwise(rates)), shape  # never rises
    assert scheduled_lr(6e-4, "linear", 150, 0.5, 75) == pytest.approx(4.5e-4)  # halfway: halfway down
    assert scheduled_lr(6e-4, "cosine", 150, 0.5, 75) == pytest.approx(4.5e-4)
    assert scheduled_lr(6e-4, "cosine", 150, 0.5, 30) > scheduled_lr(6e-4, "linear", 150, 0.5, 30)  # cosine stays high
    assert scheduled_lr(1e-3, "linear", 10, 0.0, 10) == 0.0
    assert {scheduled_lr(1e-3, "constant", 10, 0.5, d) for d in range(20)} == {1e-3}
    with pytest.raises(ValueError, match="use one of constant, linear, cosine"):
        scheduled_lr(1e-3, "step", 10, 0.0, 1)


def test_options_offer_exactly_the_schedules_there_are() -> None:
    from node.core.options import option_fields

    (f,) = [f for f in option_fields(NodeOptions) if f.name == "lr_scheduler_type"]
    assert f.metadata["choices"] == LR_SCHEDULES


def _group() -> TrainGroup:
    return TrainGroup("max 1234=", ("7", "3"), (1.0, 0.0), "me", "max", REF)


def test_the_trainer_steps_at_the_scheduled_rate_whatever_its_optimizer_state_says() -> None:
    model, tok, model_id = load_model("tiny-s", seed=0, device="cpu")
    cfg = GRPOConfig(learning_rate=1e-3, lr_scheduler_type="linear", lr_decay_rounds=4, min_lr_rate=0.25)
    trainer = GRPOTrainer(Policy(model, tok, model_id), cfg)
    got = [trainer.step([_group()], done=d)["lr"] for d in range(6)]
    assert got == pytest.approx([1e-3, 8.125e-4, 6.25e-4, 4.375e-4, 2.5e-4, 2.5e-4])
    state = trainer.optimizer.state_dict()  # a checkpoint's optimizer state carries the last rate...
    fresh = GRPOTrainer(Policy(*load_model("tiny-s", seed=0, device="cpu")[:2], model_id), cfg)
    fresh.optimizer.load_state_dict(state)
    assert fresh.step([_group()], done=1)["lr"] == pytest.approx(8.125e-4)  # ...and the schedule replaces it
    assert all(g["lr"] == pytest.approx(8.125e-4) for g in fresh.optimizer.param_groups)


def test_a_decayed_step_moves_the_weights_less() -> None:
    """The rate reaches the update: the same group at the floor moves the weights a quarter as far (Adam)."""
    moved = []
    for done in (0, 4):
        model, tok, model_id = load_model("tiny-s", seed=0, device="cpu")
        before = [p.detach().clone() for p in model.parameters()]
        cfg = GRPOConfig(learning_rate=1e-3, lr_scheduler_type="cosine", lr_decay_rounds=4, min_lr_rate=0.25)
        GRPOTrainer(Policy(model, tok, model_id), cfg).step([_group()], done=done)
        moved.append(
            math.sqrt(sum(float((p - b).pow(2).sum()) for p, b in zip(model.parameters(), before, strict=True)))
        )
    assert moved[1] / moved[0] == pytest.approx(0.25, rel=1e-3)


@pytest.mark.parametrize(
    ("opts", "fix"),
    [
        (NodeOptions(lr_decay_rounds=50), "--lr-decay-rounds 50 has no effect without --lr-schedule"),
        (NodeOptions(min_lr_rate=0.5), "--lr-floor 0.5 has no effect without --lr-schedule"),
        (NodeOptions(lr_scheduler_type="cosine"), "--lr-schedule cosine needs a length: add --lr-decay-rounds"),
    ],
)
def test_a_schedule_setting_that_cannot_take_effect_is_refused_in_one_sentence(opts: NodeOptions, fix: str) -> None:
    with pytest.raises(ValueError, match=fix):
        node_configs(opts, "", 0)


def test_a_schedule_decays_over_the_run_unless_given_its_own_length() -> None:
    over_run = node_configs(NodeOptions(lr_scheduler_type="linear", rounds=150), "", 0)[1].grpo
    own = node_configs(NodeOptions(lr_scheduler_type="linear", rounds=150, lr_decay_rounds=40), "", 0)[1].grpo
    assert (over_run.lr_decay_rounds, own.lr_decay_rounds) == (150, 40)
    assert node_configs(NodeOptions(rounds=150), "", 0)[1].grpo.lr_decay_rounds == 0  # constant: no length


def test_grpo_config_refuses_a_decay_without_a_length() -> None:
    with pytest.raises(ValueError, match="lr_decay_rounds >= 1"):
        GRPOConfig(lr_scheduler_type="linear")
    with pytest.raises(ValueError, match="min_lr_rate"):
        GRPOConfig(min_lr_rate=1.5)
