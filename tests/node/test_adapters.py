"""``--adapter lora``: only the adapters train, are checkpointed and averaged; fingerprints follow base and config."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from node.core import checkpoint
from node.core import state as node_state
from node.core.assemble import node_configs
from node.core.checkpoint import CheckpointConfig
from node.core.config import NodeConfig, NodeParts
from node.core.credit import SourceCredit
from node.core.node import Node
from node.core.options import NodeOptions
from node.tasks.verify import TrainGroup
from node.training.adapters import AdapterConfig, adapter_identity, attach_adapter
from node.training.grpo import GRPOConfig, GRPOTrainer
from node.training.models import load_model
from node.training.policy import GenerationConfig, Policy
from node.training.share import ShareControl
from protocol.schema import TaskRef
from swarm.fingerprint import model_fingerprint
from swarm.identity import Identity
from swarm.sync.tensors import flatten, float_params
from tests.fakes import Alone, FakeClock

LORA = AdapterConfig("lora", lora_rank=4, lora_alpha=8)
REF = TaskRef.make("max", {"digits": 4}, 0, 0)
FULL_FINE_TUNING_FINGERPRINTS = {"tiny-s": "9d6f326795f4d370", "tiny-gpt2": "366e6053c61195f4"}
"""model_fingerprint of the built-in models before adapters existed: peers in the field rely on them."""


@pytest.fixture(autouse=True)
def one_thread() -> Any:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def adapted(name: str = "tiny-s", cfg: AdapterConfig = LORA, base_seed: int = 0, seed: int = 0) -> Policy:
    model, tok, model_id = load_model(name, seed=base_seed, device="cpu")
    return Policy(attach_adapter(model, cfg, seed=seed), tok, model_id)


def base_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}


def adapter_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def groups() -> list[TrainGroup]:
    return [TrainGroup("max 1234=", ("4", "1", "2", "3"), (1.0, 0.0, 0.0, 0.0), "peer", "max", REF)]


def train(policy: Policy, steps: int = 2, checkpointing: bool = False) -> GRPOTrainer:
    trainer = GRPOTrainer(policy, GRPOConfig(gradient_checkpointing=checkpointing))
    for _ in range(steps):  # two steps: LoRA's B starts at 0, so A only gets a gradient from the second on
        assert trainer.step(groups())["n_groups"] == 1
    return trainer


# ---- what trains ---------------------------------------------------------------------------


@pytest.mark.parametrize("name, checkpointing", [("tiny-s", False), ("tiny-gpt2", False), ("tiny-s", True)])
def test_a_grpo_step_moves_only_the_adapters(name: str, checkpointing: bool) -> None:
    policy = adapted(name)
    model = policy.model
    base, lora = base_params(model), adapter_params(model)
    assert lora and all("lora_" in n for n in lora) and all("lora_" not in n for n in base)
    assert all(p.dtype == torch.float32 for p in lora.values())  # CPU: the base stays float32 too
    trainer = train(policy, checkpointing=checkpointing)
    assert sum(p.numel() for g in trainer.optimizer.param_groups for p in g["params"]) == sum(
        p.numel() for p in lora.values()
    )
    after_base, after_lora = base_params(model), adapter_params(model)
    assert all(torch.equal(base[n], after_base[n]) for n in base)  # bit-identical
    assert all(not torch.equal(lora[n], after_lora[n]) for n in lora)  # every A and B moved


@pytest.mark.parametrize("name", ["tiny-s", "tiny-gpt2"])
def test_a_fresh_adapter_scores_and_samples_like_its_base(name: str) -> None:
    """B starts at 0, so the wrapped model is its base: past_key_values and logits_to_keep pass through peft."""
    model, tok, model_id = load_model(name, seed=0, device="cpu")
    plain, lora = Policy(model, tok, model_id), adapted(name)
    prompts, completions = ["max 3941=", "a"], ["9", "bc"]
    greedy = GenerationConfig(temperature=0.0, max_new_tokens=4)
    assert lora.generate(prompts, 2, greedy) == plain.generate(prompts, 2, greedy)
    with torch.no_grad():
        got, mask = lora.token_logprobs(prompts, completions)
        want, _ = plain.token_logprobs(prompts, completions)
    assert torch.allclose(got, want, atol=1e-5) and mask.sum() == 5


def test_adapter_dropout_drops_only_in_gradient_passes() -> None:
    policy = adapted(cfg=dataclasses.replace(LORA, lora_dropout=0.5))
    with torch.no_grad():
        for n, p in policy.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 0.5)  # a trained adapter: dropout now changes the output
        a, _ = policy.token_logprobs(["max 12="], ["2"])
        b, _ = policy.token_logprobs(["max 12="], ["2"])  # sampling and old log-probs: no dropout
    c, _ = policy.token_logprobs(["max 12="], ["2"])
    assert torch.equal(a, b) and not torch.equal(a, c.detach())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_base_is_bfloat16_and_the_adapters_float32() -> None:
    model, tok, model_id = load_model("tiny-s", seed=0, device="cuda")
    policy = Policy(attach_adapter(model, LORA, seed=0), tok, model_id, device="cuda")
    dtypes = {p.requires_grad: p.dtype for p in policy.model.parameters()}
    want_base = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    assert dtypes == {True: torch.float32, False: want_base}
    base = base_params(policy.model)
    train(policy)
    assert all(torch.equal(base[n], p) for n, p in base_params(policy.model).items())


# ---- checkpoints ---------------------------------------------------------------------------


def stand_in(policy: Policy, tmp_path: Path) -> Any:
    """What :mod:`node.core.state` reads from a started node (no network, no sync)."""
    trainer = GRPOTrainer(policy)
    return SimpleNamespace(
        peer_id="peer", policy=policy, trainer=trainer, sync=None, round=3, sampler_rng=random.Random(0),
        credit=SourceCredit(), share=ShareControl(4), run_dir=tmp_path,
    )  # fmt: skip


def test_an_adapter_checkpoint_holds_the_adapters_and_restores_them_exactly(tmp_path: Path) -> None:
    node = stand_in(adapted(), tmp_path)
    for _ in range(2):
        node.trainer.step(groups())
    state = checkpoint.decode(checkpoint.encode(node_state.capture(node)))
    assert set(state["model"]) == set(adapter_params(node.policy.model))  # no frozen base in the file
    assert state["adapter"] == adapter_identity(node.policy.model) and "base " in state["adapter"]

    fresh = stand_in(adapted(seed=9), tmp_path)  # another adapter init
    assert not torch.equal(flatten(fresh.policy.model), flatten(node.policy.model))
    node_state.restore(fresh, state)
    want = adapter_params(node.policy.model)
    assert all(torch.equal(want[n], p) for n, p in adapter_params(fresh.policy.model).items())
    assert fresh.trainer.optimizer.state_dict()["state"].keys() == node.trainer.optimizer.state_dict()["state"].keys()
    assert fresh.round == 3


def test_a_checkpoint_of_another_base_or_adapter_is_refused(tmp_path: Path) -> None:
    state = node_state.capture(stand_in(adapted(), tmp_path))
    full_model, tok, model_id = load_model("tiny-s", seed=0, device="cpu")
    full = stand_in(Policy(full_model, tok, model_id), tmp_path)
    cases = [
        (stand_in(adapted(base_seed=1), tmp_path), "same --model, --adapter and --lora-"),  # another base
        (stand_in(adapted(cfg=dataclasses.replace(LORA, lora_rank=8)), tmp_path), "r=4 alpha=8.*r=8 alpha=8"),
        (stand_in(adapted(cfg=dataclasses.replace(LORA, lora_targets="q_proj")), tmp_path), "on q_proj\\)"),
        (full, "fine-tunes every weight; pass the same --adapter"),
    ]
    for node, message in cases:
        with pytest.raises(ValueError, match=message):
            node_state.restore(node, state)
    with pytest.raises(ValueError, match=r"holds fully fine-tuned weights.*drop --adapter"):
        node_state.restore(stand_in(adapted(), tmp_path), node_state.capture(full))
    # dropout does not change what the weights mean: such a checkpoint is taken
    node_state.restore(stand_in(adapted(cfg=dataclasses.replace(LORA, lora_dropout=0.1)), tmp_path), state)


# ---- fingerprints and the outer sync's tensors ---------------------------------------------


def test_fingerprints_follow_the_base_and_the_adapter_settings() -> None:
    for name, fp in FULL_FINE_TUNING_FINGERPRINTS.items():
        assert model_fingerprint(load_model(name, seed=3, device="cpu")[0]) == fp  # unchanged by adapters
    fp = adapted().fingerprint()
    assert fp == adapted(seed=5).fingerprint()  # the adapters' init is not who they are
    assert fp == adapted(cfg=dataclasses.replace(LORA, lora_dropout=0.2)).fingerprint()
    others = {
        adapted(base_seed=1).fingerprint(),  # other base weights, same architecture
        adapted(cfg=dataclasses.replace(LORA, lora_rank=8)).fingerprint(),
        adapted(cfg=dataclasses.replace(LORA, lora_alpha=16)).fingerprint(),
        adapted(cfg=dataclasses.replace(LORA, lora_targets="q_proj,v_proj")).fingerprint(),
        FULL_FINE_TUNING_FINGERPRINTS["tiny-s"],
    }
    assert len(others) == 5 and fp not in others


def test_the_outer_sync_averages_only_the_adapters_and_full_fine_tuning_everything() -> None:
    model = adapted().model
    lora = adapter_params(model)
    averaged = float_params(model)
    assert [p.data_ptr() for p in averaged] == [p.data_ptr() for p in model.parameters() if p.requires_grad]
    assert flatten(model).numel() == sum(p.numel() for p in lora.values()) < sum(p.numel() for p in model.parameters())
    full, _, _ = load_model("tiny-s", seed=0, device="cpu")
    assert float_params(full) == list(full.parameters())
    assert flatten(full).numel() == sum(p.numel() for p in full.parameters())


# ---- flags ---------------------------------------------------------------------------------


def test_adapter_flags_feed_the_config_and_bad_ones_name_the_fix() -> None:
    _, parts = node_configs(NodeOptions(), "", 0)
    assert parts.adapter == AdapterConfig() and not parts.adapter.enabled
    opts = NodeOptions(adapter="lora", lora_rank=8, lora_alpha=16, lora_dropout=0.1, lora_targets="q_proj, v_proj")
    _, parts = node_configs(opts, "", 0)
    assert parts.adapter == AdapterConfig(
        "lora", lora_rank=8, lora_alpha=16, lora_dropout=0.1, lora_targets="q_proj, v_proj"
    )
    assert parts.adapter.targets == ("q_proj", "v_proj")
    for bad, fix in (
        (NodeOptions(adapter="qlora"), "--adapter qlora: use one of none, lora"),
        (NodeOptions(adapter="lora", lora_rank=0), "--lora-rank must be >= 1 and <= 4096, got 0"),
        (NodeOptions(adapter="lora", lora_alpha=0), "--lora-alpha must be >= 1 and <= 65536, got 0"),
        (NodeOptions(adapter="lora", lora_dropout=1.0), "--lora-dropout must be >= 0 and < 1, got 1"),
        (NodeOptions(adapter="lora", lora_targets="q_proj,,v_proj"), "--lora-targets q_proj,,v_proj: an empty"),
        (NodeOptions(adapter="lora", lora_targets="q-proj"), "--lora-targets: 'q-proj' is not a module name"),
        (NodeOptions(lora_rank=8), "--lora-rank 8 has no effect without --adapter lora"),
    ):
        with pytest.raises(ValueError, match=fix):
            node_configs(bad, "", 0)


def test_a_target_the_model_lacks_is_an_error_naming_the_modules_it_has() -> None:
    model, _, _ = load_model("tiny-gpt2", seed=0, device="cpu")
    with pytest.raises(ValueError, match=r"no module of this model is named 'q_proj'; it has: .*c_attn, c_fc, c_proj"):
        attach_adapter(model, dataclasses.replace(LORA, lora_targets="q_proj"), seed=0)
    only_q = adapted(cfg=dataclasses.replace(LORA, lora_targets="q_proj")).model
    assert {n.split(".")[-4] for n in adapter_params(only_q)} == {"q_proj"}


# ---- a node ----------------------------------------------------------------------------------


def alone(identity: Identity, parts: NodeParts, clock: Any) -> Alone:
    return Alone()


def make_node(tmp_path: Path, name: str, seed: int, resume: bool = False) -> Node:
    cfg = NodeConfig(
        model="tiny-s", tasks=("max",), local_groups=2, num_generations=4, external_groups=0, seed=seed,
        log_dir=str(tmp_path / "runs"), identity=str(tmp_path / f"{name}.key"), device="cpu", max_threads=1,
        overlap_network=False,
    )  # fmt: skip
    parts = NodeParts(
        adapter=LORA, generation=GenerationConfig(max_new_tokens=1), checkpoint=CheckpointConfig(2, resume)
    )
    return Node(cfg, parts, clock=FakeClock(), links=alone).start()


def test_adapter_nodes_share_their_base_across_seeds_and_resume_their_adapters(tmp_path: Path) -> None:
    a, b = make_node(tmp_path, "a", seed=1), make_node(tmp_path, "b", seed=2)
    try:
        assert a.policy.fingerprint() == b.policy.fingerprint()  # the built-in base is shared under an adapter
        assert not torch.equal(flatten(a.policy.model), flatten(b.policy.model))  # the adapters' init is seeded
        for _ in range(3):
            a.run_round()
        trained = adapter_params(a.policy.model)
    finally:
        a.shutdown()
        b.shutdown()
    resumed = make_node(tmp_path, "a", seed=1, resume=True)
    try:
        assert resumed.round == 3
        assert all(torch.equal(trained[n], p) for n, p in adapter_params(resumed.policy.model).items())
    finally:
        resumed.shutdown()
