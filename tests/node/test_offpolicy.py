"""Off-policy use of peers' completions: weights by hand, clipping, a lying publisher bounded, baselines."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from node.tasks.verify import TrainGroup
from node.training.grpo import GRPOConfig, GRPOTrainer, LossNorm, grpo_loss
from node.training.models import load_model
from node.training.offpolicy import (
    FamilyBaseline,
    OffPolicyConfig,
    completion_weight,
    receiver_advantages,
)
from node.training.policy import Policy
from protocol.schema import TaskRef

REF = TaskRef.make("max", {"digits": 4}, 0, 0)
PROMPT = "max 1234="


def group(
    rewards: list[float], comps: list[str], external: bool = False, claims: list[float] | None = None
) -> TrainGroup:
    return TrainGroup(
        PROMPT, tuple(comps), tuple(rewards), "peer" if external else "self", "max", REF,
        external=external, source_model="tiny-m" if external else "", behaviour_logprobs=None if claims is None
        else tuple(claims),
    )  # fmt: skip


def policy(seed: int = 0) -> Policy:
    model, tok, model_id = load_model("tiny-s", seed=seed, device="cpu")
    return Policy(model, tok, model_id)


# --- the weight of one completion, by hand ---------------------------------------------------


def test_truncated_importance_weight_by_hand() -> None:
    cfg = OffPolicyConfig(is_cap=2.0)
    # p_own / p_pub = exp(-4 - (-3)) = e^-1
    assert completion_weight(-4.0, 2, -3.0, cfg) == pytest.approx(math.exp(-1.0))
    # exp(-3 - (-4)) = e = 2.718... is truncated at the cap
    assert completion_weight(-3.0, 2, -4.0, cfg) == 2.0
    # exactly at the cap
    assert completion_weight(math.log(2.0), 1, 0.0, cfg) == pytest.approx(2.0)
    # no claim: the ratio is taken as 1 (never above the cap)
    assert completion_weight(-9.0, 2, None, cfg) == 1.0
    assert completion_weight(-9.0, 2, None, OffPolicyConfig(is_cap=0.5)) == 0.5
    # off: every completion weighs 1
    assert completion_weight(-30.0, 2, -0.1, OffPolicyConfig()) == 1.0


def test_likelihood_filter_by_hand() -> None:
    cfg = OffPolicyConfig(min_token_logp=-5.0)
    assert completion_weight(-9.9, 2, None, cfg) == 1.0  # mean -4.95 per token: kept
    assert completion_weight(-10.2, 2, None, cfg) == 0.0  # mean -5.1: filtered
    both = OffPolicyConfig(min_token_logp=-5.0, is_cap=1.0)
    assert completion_weight(-10.2, 2, -1.0, both) == 0.0  # the filter wins over any claim
    assert completion_weight(-4.0, 2, -3.0, both) == pytest.approx(math.exp(-1.0))


@pytest.mark.parametrize("claim", [-1e6, -1e3, -50.0, -1.0, -1e-9, 0.0])
def test_a_lying_publisher_moves_no_completion_beyond_the_cap(claim: float) -> None:
    """Whatever log-probability a peer claims, the weight stays in [0, cap]; claiming likelier only lowers it."""
    cfg = OffPolicyConfig(is_cap=1.0)
    own = -7.0
    w = completion_weight(own, 2, claim, cfg)
    assert 0.0 <= w <= cfg.is_cap
    honest = completion_weight(own, 2, -7.0, cfg)  # a publisher as likely as this node: weight 1
    assert honest == 1.0
    if claim > own:  # claims its policy found the completion likelier than this one does: weight below 1
        assert w == pytest.approx(math.exp(own - claim))


def test_receiver_baseline_by_hand() -> None:
    # all correct on a family this node solves 20% of the time: (1 - 0.2) / max(std 0, 0.5) = 1.6 each
    assert receiver_advantages([1.0, 1.0, 1.0], 0.2, 0.5) == pytest.approx([1.6, 1.6, 1.6])
    # rewards [1, 0]: std 0.7071 > 0.5 divides; baseline 0.5
    assert receiver_advantages([1.0, 0.0], 0.5, 0.5) == pytest.approx([0.5 / 0.70711, -0.5 / 0.70711], rel=1e-4)
    base = FamilyBaseline(momentum=0.5)
    assert base.get("max") is None
    base.update("max", [1.0, 0.0])  # first value taken as is
    base.update("max", [0.0, 0.0])  # 0.5 * 0.5 + 0.5 * 0
    assert base.get("max") == pytest.approx(0.25)


@pytest.mark.parametrize(
    "bad", [{"min_token_logp": 0.0}, {"is_cap": -1.0}, {"is_cap": 1e3}, {"baseline": "peer"}, {"min_scale": 0.0}]
)
def test_config_validation(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="OffPolicyConfig"):
        OffPolicyConfig(**bad)


def test_presets() -> None:
    neutral = {"successes_only": False, "adaptive_share": False}
    assert OffPolicyConfig.preset("plain") == OffPolicyConfig(baseline="group", **neutral)  # SAPO's GRPO
    assert OffPolicyConfig.preset("baseline+guide+adapt") == OffPolicyConfig()  # the measured default
    assert OffPolicyConfig.preset("baseline+tis") == OffPolicyConfig(baseline="receiver", is_cap=1.0, **neutral)
    with pytest.raises(ValueError, match="use one of"):
        OffPolicyConfig.preset("magic")


# --- the loss with weights ------------------------------------------------------------------


def test_weights_scale_each_completions_token_losses() -> None:
    logp = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    cfg = GRPOConfig()
    # ratio 1 everywhere (old = current): token losses row 0 [-1, -1], row 1 [2]; bnpo over 3 tokens
    assert float(grpo_loss(logp, logp, adv, mask, cfg, norm=LossNorm(2, 3, 2))) == pytest.approx(0.0)
    w = torch.tensor([0.5, 0.25], dtype=torch.float64)
    # weighted: (-1 * 0.5 * 2 + 2 * 0.25) / 3 = -0.5 / 3
    assert float(grpo_loss(logp, logp, adv, mask, cfg, weights=w)) == pytest.approx(-0.5 / 3)


def test_external_completions_of_weight_zero_do_not_move_the_policy() -> None:
    """With a likelihood filter no peer completion passes, a step on peers' groups alone changes nothing."""
    p = policy()
    before = [x.detach().clone() for x in p.model.parameters()]
    # a lone publisher beside nothing of the node's own is past any share cap: uncapped here, both times
    strict = GRPOTrainer(
        p, GRPOConfig(learning_rate=1e-2), OffPolicyConfig(min_token_logp=-1e-3, max_publisher_share=1)
    )
    stats = strict.step([group([1.0, 0.0], ["7", "3"], external=True)])
    assert stats["n_groups"] == 1 and stats["grad_norm"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, p.model.parameters(), strict=True))
    uncapped = OffPolicyConfig(max_publisher_share=1.0)
    plain = GRPOTrainer(p, GRPOConfig(learning_rate=1e-2), uncapped).step(
        [group([1.0, 0.0], ["7", "3"], external=True)]
    )
    assert plain["grad_norm"] > 0


def test_importance_weight_uses_the_claim_and_shrinks_the_update() -> None:
    """A peer claiming its completions were near-certain (log-prob 0) gets weights p_here < 1: a smaller gradient."""
    grads = {}
    # a lone publisher: the share cap (tested on its own below) would cut it whole
    plain, tis = OffPolicyConfig(max_publisher_share=1.0), OffPolicyConfig(is_cap=1.0, max_publisher_share=1.0)
    for name, cfg in {"plain": plain, "tis": tis}.items():
        p = policy(seed=1)
        trainer = GRPOTrainer(p, GRPOConfig(max_grad_norm=0.0), cfg, diagnose=True)
        stats = trainer.step([group([1.0, 0.0], ["7", "3"], external=True, claims=[0.0, 0.0])])
        grads[name] = stats["grad_norm"]
        weight = stats["sources"]["ext:tiny-m"]["weight"]
        seq = stats["sources"]["ext:tiny-m"]["seq_logp"]
        if name == "tis":  # two completions: weight = mean of exp(own seq log-prob - 0)
            assert 0 < weight < 1 and weight == pytest.approx(math.exp(seq), rel=0.5)
        else:
            assert weight == 1.0
    assert 0 < grads["tis"] < grads["plain"]


def test_receiver_baseline_gives_an_all_correct_peer_group_signal() -> None:
    p = policy()
    # uncapped: a lone peer beside no own signal is past the share cap (tests/node/test_poisoning.py)
    trainer = GRPOTrainer(p, offpolicy=OffPolicyConfig(baseline="receiver", max_publisher_share=1.0))
    peer_all_right = group([1.0, 1.0], ["7", "7"], external=True)
    assert not trainer.has_signal(peer_all_right)  # no local reward seen yet: the group mean, no signal
    stats = trainer.step([group([0.0, 0.0], ["1", "2"]), peer_all_right])  # this node failed its own group
    assert trainer.baseline.get("max") == 0.0
    # (1 - 0) / min_scale 0.5 = 2 each, scaled to a mean |a| of 1: no more than a group of its own can reach
    assert trainer.has_signal(peer_all_right) and trainer.advantages(peer_all_right) == pytest.approx([1.0, 1.0])
    assert stats["n_groups"] == 1 and stats["n_dropped"] == 1  # its own all-wrong group has none
    assert not GRPOTrainer(p, offpolicy=OffPolicyConfig(baseline="group")).has_signal(peer_all_right)  # plain GRPO
    local_all_right = group([1.0, 1.0], ["7", "7"])
    assert not trainer.has_signal(local_all_right)  # own groups keep the group baseline


def test_success_only_guidance_keeps_a_peers_successes_and_zeroes_its_failures_by_hand() -> None:
    """baseline+guide: a strong receiver (mean 0.75 here) sees a weak peer's group [1, 0, 0, 0]: the receiver
    baseline gives (r - 0.75) / max(std 0.5, 0.5) = [0.5, -1.5, -1.5, -1.5], bounded to a mean |a| of 1
    ([0.4, -1.2, -1.2, -1.2]); success-only guidance keeps [0.4, 0, 0, 0]. Its own groups are unchanged."""
    p = policy()
    guide = GRPOTrainer(p, offpolicy=OffPolicyConfig.preset("baseline+guide"))
    guide.baseline.means["max"] = 0.75
    weak_peer = group([1.0, 0.0, 0.0, 0.0], ["9", "1", "2", "3"], external=True)
    assert guide.advantages(weak_peer) == pytest.approx([0.4, 0.0, 0.0, 0.0])
    plain_receiver = GRPOTrainer(p, offpolicy=OffPolicyConfig.preset("baseline"))
    plain_receiver.baseline.means["max"] = 0.75
    assert plain_receiver.advantages(weak_peer) == pytest.approx([0.4, -1.2, -1.2, -1.2])
    own = group([1.0, 0.0], ["9", "1"])
    assert guide.advantages(own) == pytest.approx([0.7071, -0.7071], rel=1e-3)  # its own: as before
    all_wrong_peer = group([0.0, 0.0], ["1", "2"], external=True)
    assert not guide.has_signal(all_wrong_peer)  # nothing to learn from: dropped, not pushed down


def test_diagnostics_split_local_and_external_gradients() -> None:
    p = policy()
    uncapped = OffPolicyConfig(max_publisher_share=1.0)  # half of the step from one peer: past the default cap
    trainer = GRPOTrainer(p, GRPOConfig(max_grad_norm=0.0), uncapped, diagnose=True)
    stats = trainer.step([group([1.0, 0.0], ["7", "3"]), group([0.0, 1.0], ["5", "8"], external=True)])
    src = stats["sources"]
    assert set(src) == {"local", "ext:tiny-m"}
    assert src["local"]["groups"] == 1 and src["ext:tiny-m"]["completions"] == 2
    assert src["local"]["adv_share"] + src["ext:tiny-m"]["adv_share"] == pytest.approx(1.0, abs=1e-3)
    for s in src.values():
        assert s["token_logp"] < 0 and s["seq_logp"] <= s["token_logp"]
    assert stats["grad_local"] > 0 and stats["grad_external"] > 0 and -1 <= stats["grad_cos"] <= 1
    # the two parts add up to the whole gradient (clipping is off): |a + b| <= |a| + |b|
    assert stats["grad_norm"] <= stats["grad_local"] + stats["grad_external"] + 1e-6
    local_only = GRPOTrainer(policy(), diagnose=True).step([group([1.0, 0.0], ["7", "3"])])
    assert set(local_only["sources"]) == {"local"} and local_only["grad_external"] == 0.0
    assert "grad_cos" not in local_only


def test_sequence_logprobs_match_the_token_logprobs_sum() -> None:
    p = policy()
    seq = p.sequence_logprobs([PROMPT] * 3, ["7", "12", ""], batch_rows=2)
    with torch.no_grad():
        logp, _ = p.token_logprobs([PROMPT] * 3, ["7", "12", ""])
    assert seq == pytest.approx(logp.sum(-1).tolist(), abs=1e-5)
    assert all(x < 0 for x in seq)


# --- selection that learns: alignment measured per publisher, credit, the credit policy -------


def ext(rewards: list[float], comps: list[str], peer: str, model: str = "tiny-m") -> TrainGroup:
    return TrainGroup(PROMPT, tuple(comps), tuple(rewards), peer, "max", REF, external=True, source_model=model)


@pytest.mark.parametrize("adaptive_share", [False, True])  # the share measure's parts leave the diagnostics alone
def test_alignment_of_each_publisher_with_the_local_gradient(adaptive_share: bool) -> None:
    """A peer's group teaching what this node's own group teaches aligns (cos 1); the opposite lesson is -1."""
    off = OffPolicyConfig(successes_only=False, adaptive_share=adaptive_share)  # a peer's failures teach too
    trainer = GRPOTrainer(policy(), GRPOConfig(max_grad_norm=0.0), off, diagnose=True)
    own = group([1.0, 0.0], ["7", "3"])
    same, opposite = ext([1.0, 0.0], ["7", "3"], "peerA"), ext([0.0, 1.0], ["7", "3"], "peerB", "tiny-l")
    stats = trainer.step([own, same, opposite])
    assert stats["alignment"] == pytest.approx({"peerA": 1.0, "peerB": -1.0}, abs=1e-4)
    assert set(stats["sources"]) == {"local", "ext:tiny-m", "ext:tiny-l"}


def test_source_credit_learns_bounded_and_gives_fresh_keys_nothing() -> None:
    from node.core.credit import MAX_PUBLISHERS, SourceCredit

    credit = SourceCredit(momentum=0.5)
    credit.observe({"good": 0.8, "bad": -0.6}, {"good": "tiny-m", "bad": "tiny-l"})
    credit.observe({"good": 0.4, "bad": 5.0}, {"good": "tiny-m", "bad": "tiny-l"})  # a cosine is clipped to 1
    assert credit.publishers["good"] == pytest.approx(0.6) and credit.publishers["bad"] == pytest.approx(0.2)
    assert credit.score("good", "tiny-m") == pytest.approx(1.2)
    assert credit.score("fresh-key", "new-model") == 0.0  # a minted key starts where every unknown source does
    assert credit.per_model() == {"tiny-l": pytest.approx(0.2), "tiny-m": pytest.approx(0.6)}
    for i in range(MAX_PUBLISHERS + 10):  # a flood of keys cannot grow it
        credit.observe({f"k{i}": 0.1}, {})
    assert len(credit.publishers) == MAX_PUBLISHERS and "good" not in credit.publishers


def test_credit_policy_prefers_sources_that_taught_and_still_explores() -> None:
    import random

    from node.core.credit import SourceCredit
    from node.core.pool import choose

    credit = SourceCredit(explore=0.0)
    credit.observe({"good": 0.9, "bad": -0.9}, {"good": "m1", "bad": "m2"})
    pool = [ext([1.0, 0.0], ["1", "2"], "bad", "m2"), ext([0.0, 0.0], ["1", "2"], "good", "m1")]
    pool += [ext([0.0, 1.0], ["1", "2"], "good", "m1"), ext([1.0, 0.0], ["1", "2"], "new", "m3")]

    def order(groups: list[TrainGroup]) -> list[int]:
        return credit.rank([credit.score(g.source_peer, g.source_model) for g in groups], random.Random(0))

    for seed in range(5):  # the good source's informative group, then the unknown, never the uninformative one
        assert choose(pool, 2, "credit", random.Random(seed), order=order) == [2, 3]
        assert 1 not in choose(pool, 3, "credit", random.Random(seed), order=order)
    explorer = SourceCredit(explore=1.0)
    rng = random.Random(0)

    def explore(groups: list[TrainGroup]) -> list[int]:
        return explorer.rank([0.0] * len(groups), rng)

    picks = {tuple(choose(pool, 1, "credit", random.Random(s), order=explore)) for s in range(20)}
    assert picks == {(0,), (2,), (3,)}  # exploring reaches every informative group
