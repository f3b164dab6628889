"""Adapters (``--adapter lora``): train low-rank add-ons on a frozen base model, in a fraction of the memory.

With an adapter the loaded model is wrapped by peft's LoRA: its own weights
(the *base*) are frozen and only the adapter weights train, so gradients and
AdamW state cover the adapters alone. Everything that follows the trainable
parameters follows the adapters: the GRPO optimiser (it takes
``requires_grad`` parameters), checkpoints (:mod:`node.core.state` saves the
adapter weights, not the base) and the outer sync (it averages the trainable
parameters, see :func:`swarm.sync.tensors.float_params`).

Two adapter nodes may average only if they adapt the same base the same way:
:func:`attach_adapter` records on the model an identity (a sha256 of the base
weights, computed once here, and the adapter's shape-defining settings) that
:func:`swarm.fingerprint.model_fingerprint` and the checkpoint check include.

peft is imported only when an adapter is attached: nodes without one (and the
command line) never pay for it.
"""

from __future__ import annotations

import hashlib
import logging
import warnings
from typing import Any

import torch
from torch import Tensor

from node.training.configs import ADAPTERS as ADAPTERS
from node.training.configs import AdapterConfig as AdapterConfig
from node.training.configs import parse_targets as parse_targets
from node.training.policy import default_compute_dtype
from swarm.fingerprint import IDENTITY_ATTR

logger = logging.getLogger(__name__)

LLAMA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GPT2_TARGETS = ("c_attn", "c_proj", "c_fc")
DEFAULT_TARGETS = LLAMA_TARGETS + GPT2_TARGETS
"""The attention and MLP projections adapted when ``--lora-targets`` is not given (those the model has):
Llama-family names (Llama, Qwen2, Mistral, SmolLM2) and GPT-2's."""

SHARED_BASE_SEED = 0
"""A built-in tiny model's base under an adapter is its init from this seed, whatever ``--seed`` is: a
frozen base is meant to be shared, and peers whose bases differ never average (``--seed`` still seeds
the adapters' init and the sampling). With the outer sync on, the trained weights (a built-in model's,
or the adapters') start from this seed too: every peer of one model then starts at one revision-0
state, so newcomers whose bootstrap peer is gone cannot start histories of their own from revision 0."""


def base_weights_sha256(model: torch.nn.Module) -> str:
    """sha256 (hex) of every parameter's name, shape and float32 bytes, in name order.

    Streamed one tensor at a time (a real LM is never copied whole), and taken in float32 so the
    same base hashes the same whether this node keeps it in float32 or bfloat16.
    """
    h = hashlib.sha256(b"swarm-node/base-weights/v1\n")
    for name, p in sorted(model.named_parameters(), key=lambda item: item[0]):
        h.update(f"{name}|{tuple(p.shape)}\n".encode())
        h.update(p.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4", copy=False).tobytes())
    return h.hexdigest()


def adaptable_modules(model: torch.nn.Module) -> dict[str, str]:
    """Full module name -> its last component, for the layers LoRA can wrap (linear, GPT-2 Conv1D, embedding)."""
    from transformers.pytorch_utils import Conv1D

    kinds = (torch.nn.Linear, torch.nn.Embedding, Conv1D)
    return {name: name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, kinds)}


def resolve_targets(model: torch.nn.Module, cfg: AdapterConfig) -> tuple[str, ...]:
    """The module names to adapt on ``model``: ``cfg.targets``, or the default projections it has.

    A target that matches no module (by its name or a dotted suffix) is a ValueError naming the
    modules that exist.
    """
    modules = adaptable_modules(model)
    existing = ", ".join(sorted(set(modules.values())))
    if not cfg.targets:
        found = tuple(t for t in DEFAULT_TARGETS if t in modules.values())
        if not found:
            raise ValueError(
                f"--adapter lora: this model has none of the usual projections ({','.join(DEFAULT_TARGETS)}); "
                f"name its layers with --lora-targets (it has: {existing})"
            )
        return found
    for t in cfg.targets:
        if not any(name == t or name.endswith("." + t) for name in modules):
            raise ValueError(f"--lora-targets: no module of this model is named {t!r}; it has: {existing}")
    return tuple(dict.fromkeys(cfg.targets))


class GradOnlyDropout(torch.nn.Dropout):
    """Dropout that drops only in passes that build a gradient.

    The node keeps its model in eval mode throughout (plain dropout would never drop), and
    sampling and the no-grad scoring passes (old log-probs, claimed log-probs) must see the
    whole adapter; so the gradient pass is told apart by ``torch.is_grad_enabled()``.
    """

    def forward(self, x: Tensor) -> Tensor:
        return torch.nn.functional.dropout(x, self.p, training=torch.is_grad_enabled())


def attach_adapter(model: Any, cfg: AdapterConfig, seed: int) -> Any:
    """Wrap ``model`` (float32, on its device) with a LoRA adapter; returns the peft model (eval mode).

    The base is frozen and, where the policy computes in bfloat16 (a CUDA device that supports
    it), stored in bfloat16: half the memory, and the autocast passes round to bf16 anyway. On
    a CPU it stays float32 for training and scoring; sampling runs on a bf16 copy with the adapter
    merged where the CPU has native bf16 (:mod:`node.training.sampler`). Adapter weights are float32
    (the optimiser's master copy).
    The adapters' initial weights depend only on ``seed`` (the caller's RNG is left untouched).
    """
    from peft import LoraConfig, get_peft_model
    from transformers.pytorch_utils import Conv1D

    targets = resolve_targets(model, cfg)
    base_hash = base_weights_sha256(model)
    modules = adaptable_modules(model)
    conv1d = any(
        isinstance(model.get_submodule(name), Conv1D)
        for name in modules
        if any(name == t or name.endswith("." + t) for t in targets)
    )
    lora = LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=list(targets),
        fan_in_fan_out=conv1d,  # GPT-2's Conv1D stores its weight transposed
        bias="none",
        task_type="CAUSAL_LM",
    )
    model.requires_grad_(False)
    # adapters are made while the base is still float32, so their init is the same float32 numbers on
    # every device (peft draws it on the CPU generator)
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        torch.manual_seed(seed)
        # peft asks the model through an attribute transformers 5 deprecates; nothing for a user to act on
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        wrapped = get_peft_model(model, lora)
    dtype = default_compute_dtype(next(model.parameters()).device)
    for p in wrapped.parameters():
        if p.requires_grad:
            p.data = p.data.float()
        elif dtype is not None:  # parameters only: buffers (rotary frequencies) keep their precision
            p.data = p.data.to(dtype)
    for module in wrapped.modules():
        drop = getattr(module, "lora_dropout", None)
        if isinstance(drop, torch.nn.ModuleDict):
            for key, d in list(drop.items()):
                if isinstance(d, torch.nn.Dropout):
                    drop[key] = GradOnlyDropout(d.p)
    wrapped.eval()
    setattr(wrapped, IDENTITY_ATTR, f"base {base_hash[:16]}, {cfg.describe(targets)}")
    trained = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    total = sum(p.numel() for p in wrapped.parameters())
    logger.info(
        "adapter %s: %d of %d parameters train (%.2f%%); base %s frozen in %s",
        cfg.describe(targets), trained, total, 100.0 * trained / total, base_hash[:16],
        str(dtype or torch.float32).removeprefix("torch."),
    )  # fmt: skip
    return wrapped


def adapter_identity(model: torch.nn.Module) -> str | None:
    """The identity :func:`attach_adapter` recorded (base hash and adapter settings); None without an adapter."""
    value = getattr(model, IDENTITY_ATTR, None)
    return value if isinstance(value, str) else None


def trainable_state(model: torch.nn.Module) -> dict[str, Tensor]:
    """CPU copies of the trainable parameters, by name: an adapter node's checkpoint of its weights."""
    return {name: p.detach().to("cpu").clone() for name, p in model.named_parameters() if p.requires_grad}


def load_trainable_state(model: torch.nn.Module, state: dict[str, Tensor]) -> None:
    """Copy a :func:`trainable_state` back; a ValueError if its names or shapes are not this model's."""
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    if set(state) != set(params):
        missing, extra = sorted(set(params) - set(state)), sorted(set(state) - set(params))
        raise ValueError(f"adapter checkpoint lacks {missing[:3]} and has extra {extra[:3]}; start without --resume")
    with torch.no_grad():
        for name, p in params.items():
            if tuple(state[name].shape) != tuple(p.shape):
                shape = tuple(state[name].shape)
                raise ValueError(f"adapter checkpoint: {name} has shape {shape}, not {tuple(p.shape)}")
            p.copy_(state[name].to(p.device, p.dtype))
