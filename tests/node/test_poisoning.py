"""Poisoning through the only informative rows (issue 51): the publisher share cap and the plausibility gate.

A peer's valid, all-correct groups with junk text around the right answer were the only informative rows
of a node whose own groups had no signal. No process, no network: the trainer's defences on rows and on a
real tiny policy whose log-probabilities are replaced where the test needs them to differ.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
import torch

from node.tasks.reasons import RejectReason
from node.tasks.verify import TrainGroup
from node.training.grpo import INFORMATIVE, GRPOConfig, GRPOTrainer, Row, cap_publisher_share
from node.training.models import load_model
from node.training.offpolicy import OffPolicyConfig, OwnLikelihood, share_limit
from node.training.policy import Policy
from protocol.schema import TaskRef

REF = TaskRef.make("max", {"digits": 4}, 0, 0)
PROMPT = "max 1234="
JUNK = "~^~^ BUY@evil "


def group(rewards: Sequence[float], comps: Sequence[str], peer: str = "") -> TrainGroup:
    return TrainGroup(
        PROMPT, tuple(comps), tuple(rewards), peer or "self", "max", REF, external=bool(peer),
        source_model="tiny-m" if peer else "",
    )  # fmt: skip


def policy() -> Policy:
    model, tok, model_id = load_model("tiny-s", seed=0, device="cpu")
    return Policy(model, tok, model_id)


def rows(unit: str, n: int, advantage: float = 1.0) -> list[Row]:
    return [Row(PROMPT, "4", advantage, unit != "local", unit=unit) for _ in range(n)]


def shares(kept: Sequence[Row]) -> tuple[dict[str, float], dict[str, float]]:
    """Each unit's share of the informative rows and of the advantage mass."""
    n: dict[str, float] = {}
    m: dict[str, float] = {}
    for r in kept:
        if abs(r.advantage) > INFORMATIVE:
            n[r.unit] = n.get(r.unit, 0) + 1
            m[r.unit] = m.get(r.unit, 0.0) + abs(r.advantage)
    total_n, total_m = sum(n.values()) or 1, sum(m.values()) or 1.0
    return {u: v / total_n for u, v in n.items()}, {u: v / total_m for u, v in m.items()}


# --- the share cap on rows ------------------------------------------------------------------------


def test_share_limit_is_the_largest_level_no_publisher_passes() -> None:
    for own, amounts, share in [(0.0, [10.0], 0.34), (8.0, [32.0, 8.0], 0.34), (3.0, [5.0, 7.0, 30.0], 0.25)]:
        limit = share_limit(own, amounts, share)
        whole = own + sum(min(a, limit) for a in amounts)
        assert limit == pytest.approx(share * whole)  # exactly at the share, not below
    assert share_limit(0.0, [8.0, 8.0, 8.0], 0.34) == math.inf  # three at a third each: none cut
    assert share_limit(5.0, [1.0], 0.34) == math.inf
    assert share_limit(0.0, [10.0], 1.0) == math.inf  # off


def test_a_lone_informative_publisher_beside_no_own_signal_is_cut_to_its_share() -> None:
    """Issue 51's shape: the node's own rows have no signal (dropped before), one peer's are all that is left."""
    kept, cut = cap_publisher_share(rows("poisoner", 64), 0.34)
    assert kept == [] and cut == 64
    # beside 8 informative rows of the node's own: 0.34 x (8 + L) = L, L = 4.12, so 4 rows of 64
    kept, cut = cap_publisher_share(rows("local", 8) + rows("poisoner", 64), 0.34)
    row_share, mass_share = shares(kept)
    assert sum(r.unit == "poisoner" for r in kept) == 4 and cut == 60
    assert row_share["poisoner"] <= 0.34 and mass_share["poisoner"] <= 0.34 + 1e-9
    assert sum(r.unit == "local" for r in kept) == 8  # the node's own rows are never cut
    # the defence off: the poisoner is 8/9 of the rows
    kept, cut = cap_publisher_share(rows("local", 8) + rows("poisoner", 64), 1.0)
    assert cut == 0 and shares(kept)[0]["poisoner"] == pytest.approx(64 / 72)


def test_several_honest_publishers_together_fill_a_step_of_a_node_without_own_signal() -> None:
    """The cap is per publisher: a weak node that learns from peers alone still trains on three of them whole."""
    step = rows("a", 8) + rows("b", 8) + rows("c", 8)
    kept, cut = cap_publisher_share(step, 0.34)
    assert cut == 0 and kept == step
    # a fourth, louder one is cut to the level the others set; they keep theirs
    kept, cut = cap_publisher_share(step + rows("loud", 40), 0.34)
    count = {u: sum(r.unit == u for r in kept) for u in "abc"}
    assert count == {"a": 8, "b": 8, "c": 8} and sum(r.unit == "loud" for r in kept) == 12 and cut == 28
    assert max(shares(kept)[0].values()) <= 0.34


def test_advantage_mass_is_capped_where_rows_are_not() -> None:
    """A peer within its row share but with larger advantages (receiver baseline: |a| = 1 each) is scaled down."""
    own = rows("local", 8, advantage=0.25)  # a group-normalised own group of rare successes: small |a|
    peer = rows("peer", 4, advantage=1.0)
    kept, cut = cap_publisher_share(own + peer, 0.34)
    row_share, mass_share = shares(kept)
    assert row_share["peer"] == pytest.approx(4 / 12)  # 0.333 <= 0.34: no row is dropped
    assert mass_share["peer"] == pytest.approx(0.34) and cut == 4  # 4 / 6 of the mass before
    assert [r.advantage for r in kept if r.unit == "local"] == [0.25] * 8
    kept, cut = cap_publisher_share(own + peer, 1.0)
    assert cut == 0 and shares(kept)[1]["peer"] == pytest.approx(4 / 6)


def test_the_trainer_caps_a_peers_all_correct_group_against_its_own_failed_ones() -> None:
    """Receiver baseline: this node fails its family, so a peer's all-correct group has |a| = 1 on every row."""
    trainer = GRPOTrainer(policy(), GRPOConfig(), OffPolicyConfig(max_logp_gap=0.0))
    own_failed = [group([0.0] * 4, ["1", "2", "3", "5"]) for _ in range(2)]
    own_some = group([1.0, 0.0, 0.0, 0.0], ["4", "1", "2", "3"])
    poison = [group([1.0] * 4, ["4"] * 4, peer="poisoner") for _ in range(4)]
    trainer.step(own_failed)  # the receiver's expected reward on the family: 0

    stats = trainer.step([*own_failed, own_some, *poison])

    assert stats["publisher_rows"]["poisoner"] == 2  # 0.34 x (4 + L) = L: 2.06
    assert stats["cut"] == {RejectReason.SHARE_CAP.value: 16 - 2 + 2}  # 14 dropped, 2 scaled down
    own_mass = sum(abs(a) for a in trainer.advantages(own_some))
    assert stats["publisher_adv"]["poisoner"] <= 0.34 * (own_mass + stats["publisher_adv"]["poisoner"]) + 1e-6
    uncapped = GRPOTrainer(policy(), GRPOConfig(), OffPolicyConfig(max_logp_gap=0.0, max_publisher_share=1.0))
    uncapped.step(own_failed)
    assert uncapped.step([*own_failed, own_some, *poison])["publisher_rows"]["poisoner"] == 16  # 4 / 5 of rows


def test_a_lone_peer_cut_whole_is_no_trained_group_and_moves_no_weight(caplog: pytest.LogCaptureFixture) -> None:
    """Beside no signal of its own, a lone peer's group keeps nothing: the step reports no group trained, and
    the node says once how to learn from a single peer."""
    p = policy()
    trainer = GRPOTrainer(p, GRPOConfig(learning_rate=1e-2), OffPolicyConfig(max_logp_gap=0.0))
    before = [x.detach().clone() for x in p.model.parameters()]
    stats = trainer.step([group([0.0] * 4, ["1", "2", "3", "5"]), group([1.0, 0.0], ["4", "1"], peer="lone")])
    assert stats["n_groups"] == 0 and stats["n_completions"] == 0 and stats["cut"]
    assert all(torch.equal(a, b) for a, b in zip(before, p.model.parameters(), strict=True))
    trainer.step([group([0.0] * 4, ["1", "2", "3", "5"]), group([1.0, 0.0], ["4", "1"], peer="lone")])
    assert sum("raise --max-publisher-share" in r.getMessage() for r in caplog.records) == 1


# --- the plausibility gate ------------------------------------------------------------------------


def test_own_likelihood_is_a_bounded_window_with_a_median() -> None:
    own = OwnLikelihood(window=3)
    assert own.median() is None and own.floor(2.0) is None
    own.add([-1.0, -9.0, -2.0, -3.0, float("-inf")])  # the oldest fall out, a non-finite score never counts
    assert list(own.values) == [-9.0, -2.0, -3.0] and own.median() == -3.0
    assert own.floor(2.5) == -5.5 and own.floor(0.0) is None  # 0: off


class Scored(GRPOTrainer):
    """A trainer whose policy scores each completion's mean token log-probability as ``scores`` says."""

    scores: dict[str, float] = {}

    def _token_logps(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        return [self.scores.get(c, -1.0) for c in completions]


def gate_step(gap: float) -> dict[str, object]:
    """Own completions at -1.0 nats/token; an honest peer of another model at -2.4; junk around '4' at -5.5."""
    trainer = Scored(policy(), GRPOConfig(), OffPolicyConfig(max_logp_gap=gap, max_publisher_share=1.0))
    trainer.scores = {"1": -1.0, "2": -1.1, "4": -0.9, "3": -1.0, "44": -2.4, JUNK + "4": -5.5}
    own = group([1.0, 0.0, 0.0, 0.0], ["4", "1", "2", "3"])
    honest = group([1.0, 0.0], ["44", "1"], peer="honest")
    junk = group([1.0] * 4, [JUNK + "4"] * 4, peer="poisoner")
    trainer.step([group([0.0] * 4, ["1", "2", "3", "1"])])  # receiver baseline 0: the junk group has signal
    return trainer.step([own, honest, junk])


def test_junk_text_around_a_right_answer_gets_weight_zero_and_is_counted() -> None:
    stats = gate_step(gap=2.5)  # own median -1.0: the floor is -3.5
    assert stats["cut"] == {RejectReason.IMPLAUSIBLE.value: 4}
    assert "poisoner" not in stats["publisher_rows"]  # type: ignore[operator]
    assert stats["publisher_rows"] == {"honest": 2}  # a peer of another model, 1.4 below: kept
    off = gate_step(gap=0.0)
    assert off["cut"] == {} and off["publisher_rows"] == {"honest": 2, "poisoner": 4}


def test_the_gate_scores_peers_with_the_real_policy_against_its_own_completions() -> None:
    """No replaced scores: this node's own reference comes from its own groups, with signal or not."""
    trainer = GRPOTrainer(policy(), GRPOConfig(), OffPolicyConfig(max_logp_gap=2.5, max_publisher_share=1.0))
    stats = trainer.step([group([0.0] * 4, ["1", "2", "3", "5"]), group([1.0, 0.0], ["4", "1"], peer="p")])
    assert len(trainer.own_logp.values) == 4  # the own group had no signal, and still fed the reference
    assert stats["publisher_rows"] == {"p": 2}  # an untrained policy finds every digit about as likely
