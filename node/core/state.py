"""What a node checkpoint holds, and putting it back (see :mod:`node.core.checkpoint` for the file)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Protocol

from node.core.credit import SourceCredit
from node.core.links import Sync
from node.observe.logs import CONTEXT
from node.training.adapters import adapter_identity, load_trainable_state, trainable_state
from node.training.grpo import GRPOTrainer
from node.training.policy import Policy
from node.training.share import ShareControl


class Checkpointable(Protocol):
    """What a checkpoint captures and restores (a started :class:`~node.core.node.Node`)."""

    peer_id: str
    policy: Policy
    trainer: GRPOTrainer
    sync: Sync | None
    round: int
    sampler_rng: random.Random
    credit: SourceCredit
    share: ShareControl

    @property
    def run_dir(self) -> Path: ...


FORMAT = 1


def capture(node: Checkpointable) -> dict[str, Any]:
    """Weights, optimizer state, outer-sync state (anchor, any momentum, revision), round and sampler RNG.

    An adapter node saves its adapter weights only (the frozen base is loaded again at start) and
    the identity of its base and adapter (``adapter``; None under full fine-tuning).
    """
    model = node.policy.model
    identity = adapter_identity(model)
    return {
        "format": FORMAT,
        "peer": node.peer_id,
        "model_id": node.policy.model_id,
        "round": node.round,
        "adapter": identity,
        "model": model.state_dict() if identity is None else trainable_state(model),
        "optimizer": node.trainer.optimizer.state_dict(),
        "sync": None if node.sync is None else node.sync.state_dict(),
        "rng": node.sampler_rng.getstate(),
        # what the node learned about its sources: its per-family expected reward and its credits
        "learned": {
            "baseline": dict(node.trainer.baseline.means),
            "publishers": dict(node.credit.publishers),
            "models": dict(node.credit.models),
            "share": node.share.state(),
        },
    }


def restore(node: Checkpointable, state: dict[str, Any]) -> None:
    """Put a :func:`capture` back into a started node; a checkpoint of another model is a ValueError."""
    if state.get("format") != FORMAT:
        raise ValueError(f"checkpoint format {state.get('format')!r} is not {FORMAT}; start without --resume")
    if state["model_id"] != node.policy.model_id:
        raise ValueError(
            f"the checkpoint in {node.run_dir} is of model {state['model_id']}, not {node.policy.model_id}; "
            "pass the same --model or another --log-dir"
        )
    _check_adapter(node, state.get("adapter"))  # absent in checkpoints written before adapters: full fine-tuning
    if adapter_identity(node.policy.model) is None:
        node.policy.model.load_state_dict(state["model"])
    else:
        load_trainable_state(node.policy.model, state["model"])
    node.trainer.optimizer.load_state_dict(state["optimizer"])
    if node.sync is not None and state["sync"] is not None:
        node.sync.load_state_dict(state["sync"])
    node.sampler_rng.setstate(state["rng"])
    learned = state.get("learned") or {}  # absent in checkpoints written before it existed
    node.trainer.baseline.means.update(learned.get("baseline", {}))
    for name in ("publishers", "models"):
        table = getattr(node.credit, name)
        for key, value in learned.get(name, {}).items():
            table.fold(key, float(value), 0.0)
    if "share" in learned:
        node.share.restore(learned["share"])
    node.round = CONTEXT.round = int(state["round"])


def _check_adapter(node: Checkpointable, saved: str | None) -> None:
    """A ValueError naming the fix unless the checkpoint was written with this node's base and adapter."""
    mine = adapter_identity(node.policy.model)
    if saved == mine:
        return
    if saved is None:
        what, fix = "fully fine-tuned weights", "drop --adapter"
    elif mine is None:
        what, fix = f"an adapter ({saved})", "pass the same --adapter and --lora-* flags"
    else:
        what, fix = f"an adapter ({saved})", "pass the same --model, --adapter and --lora-* flags"
    here = "fine-tunes every weight" if mine is None else f"trains an adapter ({mine})"
    raise ValueError(f"the checkpoint in {node.run_dir} holds {what}, but this node {here}; {fix} or another --log-dir")
