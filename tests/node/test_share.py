"""The adaptive external share: its estimates by hand, its controller on scripted samples, and a real trainer's
part gradients and probe (tiny model, real GRPO)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from node.tasks.verify import TrainGroup
from node.training.diagnostics import flat_grad
from node.training.grpo import GRPOConfig, GRPOTrainer, LossNorm, grpo_loss
from node.training.models import load_model
from node.training.offpolicy import OffPolicyConfig
from node.training.policy import Policy
from node.training.share import PROBE_GROUPS, ShareControl, ShareSample, share_sample
from protocol.schema import TaskRef

REF = TaskRef.make("max", {"digits": 4}, 0, 0)


def test_share_sample_by_hand() -> None:
    g_a, g_b, g_e = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 0.0]), torch.tensor([0.0, 4.0])
    # own: <a, b> / (2 x 1) = 3 / 2; peer: <e, a + b> / (4 x 3) = (0 x 4 + 4 x 2) / 12
    got = share_sample(g_a, g_b, g_e, 2, 1, 4)
    assert got is not None and (got.own, got.peer) == pytest.approx((1.5, 8 / 12))
    assert share_sample(g_a, g_b, g_e, 1, 0, 1) is None and share_sample(g_a, g_b, g_e, 1, 1, 0) is None


def _feed(control: ShareControl, own: float, peer: float, steps: int) -> list[int]:
    taken = []
    for _ in range(steps):
        control.observe(ShareSample(own, peer))
        taken.append(control.taken)
    return taken


def test_the_controller_gives_slots_back_while_peers_teach_less_and_takes_them_again_when_they_teach_more() -> None:
    control = ShareControl(most=4, min_steps=3)
    assert control.taken == 4 and control.probe() == 0
    assert _feed(control, own=1.0, peer=0.3, steps=8) == [4, 4, 3, 2, 1, 0, 0, 0]  # nothing moves before min_steps
    assert control.probe() == PROBE_GROUPS and control.value() == pytest.approx(0.3)
    # peers' groups now teach 3x an own group: the running means cross over after a few steps, then one slot a step
    climb = _feed(control, own=1.0, peer=3.0, steps=10)
    assert climb[-1] == 4 and climb == sorted(climb) and control.probe() == 0


def test_a_node_whose_own_groups_teach_nothing_takes_peers_that_do() -> None:
    control = ShareControl(most=2, min_steps=1, taken=0)
    assert _feed(control, own=-0.1, peer=0.2, steps=2) == [1, 2]
    assert control.value() is None  # no unit to measure in
    assert _feed(ShareControl(most=2, min_steps=1), own=-0.1, peer=-0.2, steps=2) == [1, 0]


def test_the_threshold_is_the_worth_of_a_peers_group_in_own_groups() -> None:
    assert _feed(ShareControl(most=1, min_steps=1, threshold=0.5), own=1.0, peer=0.6, steps=1) == [1]
    assert _feed(ShareControl(most=1, min_steps=1, threshold=0.7), own=1.0, peer=0.6, steps=1) == [0]


def test_a_restored_state_keeps_what_was_measured_within_the_slots_there_are() -> None:
    control = ShareControl(most=4, min_steps=1)
    _feed(control, own=1.0, peer=0.0, steps=2)
    again = ShareControl(most=1)
    again.restore(control.state())
    assert (again.own, again.peer, again.steps, again.taken) == (control.own, control.peer, 2, 1)


# --- a real trainer ------------------------------------------------------------------------------


def _group(rewards: list[float], completions: list[str], prompt: str, external: bool = False) -> TrainGroup:
    return TrainGroup(prompt, tuple(completions), tuple(rewards), "peer" if external else "me", "max", REF, external)


OWN = [
    _group([1.0, 0.0, 0.0], ["7", "3", "1"], "max 1274="),
    _group([0.0, 1.0, 0.0], ["2", "8", "4"], "max 2813="),
]
# group baseline and no share cap: a peer's copy of an own group has that group's rows, advantages and gradient
MEASURE = OffPolicyConfig(
    baseline="group", successes_only=False, adaptive_share=True, max_publisher_share=1.0, max_logp_gap=0.0
)


def _trainer(offpolicy: OffPolicyConfig = MEASURE) -> GRPOTrainer:
    model, tok, model_id = load_model("tiny-s", seed=5, device="cpu")
    return GRPOTrainer(Policy(model, tok, model_id), GRPOConfig(learning_rate=1e-2), offpolicy)


def _grad(trainer: GRPOTrainer, group: TrainGroup, norm: LossNorm) -> torch.Tensor:
    """One group's part of a step's gradient, by hand: its rows' GRPO loss under the step's normaliser."""
    params = [p for g in trainer.optimizer.param_groups for p in g["params"]]
    trainer.optimizer.zero_grad(set_to_none=True)
    logp, mask = trainer.policy.token_logprobs([group.prompt] * len(group.completions), list(group.completions))
    adv = torch.tensor(trainer.advantages(group))
    grpo_loss(logp, logp.detach(), adv, mask, trainer.cfg, None, norm).backward()
    g = flat_grad(params)
    trainer.optimizer.zero_grad(set_to_none=True)
    return g


def test_the_measured_share_is_the_parts_gradients_computed_by_hand() -> None:
    trainer = _trainer()
    peer = dataclasses.replace(OWN[0], source_peer="peer", external=True)
    rows = trainer._rows([*OWN, peer])
    norm = trainer._norm(rows)
    g1, g2 = (_grad(trainer, g, norm) for g in OWN)

    share = trainer.step([*OWN, peer])["share"]

    # halves: OWN[0] is a, OWN[1] is b; the peer's group is OWN[0]'s copy, so its gradient is g1's
    assert share.own == pytest.approx(float(g1 @ g2), rel=1e-4)
    assert share.peer == pytest.approx(float(g1 @ (g1 + g2)) / 2, rel=1e-4)


def _step_grads(trainer: GRPOTrainer, **step: Any) -> torch.Tensor:
    """The gradient a trainer step applies, captured at the optimiser step."""
    params = [p for g in trainer.optimizer.param_groups for p in g["params"]]
    captured: list[torch.Tensor] = []
    inner = trainer.optimizer.step

    def capture(*a: Any, **k: Any) -> Any:
        captured.append(flat_grad(params))
        return inner(*a, **k)

    trainer.optimizer.step = capture  # type: ignore[method-assign]
    trainer.step(OWN, **step)
    return captured[0]


def test_probe_groups_are_measured_but_the_step_applies_only_its_own() -> None:
    peer = _group([1.0, 0.0, 0.0], ["9", "5", "6"], "max 1923=", external=True)
    alone = _step_grads(_trainer())
    probed_trainer = _trainer()
    probed = _step_grads(probed_trainer, probe=[peer])

    assert torch.allclose(probed, alone, atol=1e-7), "a probe group's gradient reached the step"
    stats = probed_trainer.step(OWN, probe=[peer])
    assert stats["share"] is not None and stats["n_completions"] == 6 and not stats["publisher_rows"]


def test_without_adaptive_share_nothing_is_measured_and_probes_are_ignored() -> None:
    trainer = _trainer(dataclasses.replace(MEASURE, adaptive_share=False))
    peer = _group([1.0, 0.0, 0.0], ["9", "5", "6"], "max 1923=", external=True)
    stats = trainer.step(OWN, probe=[peer])
    assert stats["share"] is None and stats["n_completions"] == 6


def test_success_only_guidance_keeps_a_peers_successes_and_zeroes_its_failures_by_hand() -> None:
    trainer = _trainer(OffPolicyConfig(baseline="receiver", successes_only=True))
    trainer.baseline.update("max", [1.0, 0.0, 0.0, 0.0])  # this node expects 0.25 on max
    peer = _group([1.0, 0.0, 0.0, 1.0], ["7", "3", "1", "7"], "max 1274=", external=True)
    # receiver baseline: (r - 0.25) / max(std, 0.5), std = sqrt(4 x 0.25 / 3) = 0.577 -> 1.299 and -0.433;
    # mean |a| = 0.866 <= 1 (no bound); success-only: the negatives become 0
    assert trainer.advantages(peer) == pytest.approx([1.299, 0.0, 0.0, 1.299], abs=1e-3)
    own = dataclasses.replace(peer, external=False, source_peer="me")
    assert trainer.advantages(own) == pytest.approx([0.866, -0.866, -0.866, 0.866], abs=1e-3)  # its own: unchanged
