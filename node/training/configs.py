"""The training layer's configs that a node's options feed: GRPO's, sampling's, the adapter's, evaluation's.

Standard library only at import, so the command line reads their fields' help, defaults and ranges
(:mod:`node.core.options`) without loading torch. Each option-fed field declares its help, and its range
(``min``/``max`` inclusive, ``above``/``below`` exclusive) and ``choices`` where it has them, in its
metadata, the one statement of them: each ``__post_init__`` checks them with
:func:`swarm.declared.check_declared` and states only what a declaration cannot. The modules that use
them (:mod:`node.training.grpo`, ``policy``, ``adapters``, ``evaluate``) re-export them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from node.training.schedule import LR_SCHEDULES
from swarm.declared import check_declared

PRECISIONS = ("auto", "float32", "bfloat16")
"""``--sample-precision`` values: auto (bf16 where the CPU has native bf16 and the model is large), or one."""

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo")

ADAPTERS = ("none", "lora")

_TARGET_NAME = re.compile(r"[A-Za-z0-9_.]+")


@dataclass(frozen=True)
class GRPOConfig:
    """Hyper-parameters of the GRPO inner optimiser (TRL names where they exist)."""

    learning_rate: float = field(
        default=1e-3,
        metadata={"help": "learning rate", "above": 0, "below": 1},
    )
    beta: float = field(default=0.0, metadata={"help": "KL coefficient against the initial weights; 0 disables."})
    epsilon: float = field(default=0.2, metadata={"help": "Lower clip range: ratio >= 1 - epsilon."})
    epsilon_high: float = field(default=0.28, metadata={"help": "Upper clip range: ratio <= 1 + epsilon_high."})
    num_iterations: int = field(default=1, metadata={"help": "Optimiser updates per batch of groups (mu)."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient norm clip; 0 disables clipping."})
    scale_rewards: bool = field(default=True, metadata={"help": "Divide advantages by the group's std."})
    loss_type: str = field(default="bnpo", metadata={"help": "Token averaging: grpo, bnpo or dr_grpo."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW beta1."})
    adam_beta2: float = field(default=0.999, metadata={"help": "AdamW beta2."})
    adam_epsilon: float = field(default=1e-8, metadata={"help": "AdamW epsilon."})
    lr_scheduler_type: str = field(
        default="constant",
        metadata={
            "help": (
                "learning-rate schedule by round: constant, or linear or cosine decay from --lr to "
                "--lr-floor x --lr over --lr-decay-rounds, then held there"
            ),
            "choices": LR_SCHEDULES,
        },
    )
    lr_decay_rounds: int = field(
        default=0,
        metadata={"help": "rounds over which --lr-schedule decays the rate (0: --rounds)", "min": 0, "max": 10000000},
    )
    min_lr_rate: float = field(
        default=0.0,
        metadata={"help": "the rate at the end of --lr-schedule's decay, as a fraction of --lr", "min": 0, "max": 1},
    )
    micro_batch_size: int = field(
        default=64,
        metadata={"help": "completions per forward/backward pass", "min": 1},
    )
    gradient_checkpointing: bool = field(
        default=False,
        metadata={
            "help": "recompute activations in the backward pass: less memory for a real LM, ~1/3 more training time"
        },
    )

    def __post_init__(self) -> None:
        check_declared(self)  # learning_rate, the schedule, min_lr_rate and micro_batch_size
        checks = [
            (self.beta >= 0, "beta must be >= 0"),
            (0 <= self.epsilon < 1, "epsilon must be in [0, 1)"),
            (self.epsilon_high >= 0, "epsilon_high must be >= 0"),
            (1 <= self.num_iterations <= 64, "num_iterations must be in [1, 64]"),
            (self.max_grad_norm >= 0, "max_grad_norm must be >= 0"),
            (self.loss_type in LOSS_TYPES, f"loss_type must be one of {LOSS_TYPES}"),
            (
                self.lr_scheduler_type == "constant" or self.lr_decay_rounds >= 1,
                "a decaying lr_scheduler_type needs lr_decay_rounds >= 1 (e.g. the run's rounds)",
            ),
            (self.weight_decay >= 0, "weight_decay must be >= 0"),
            (0 <= self.adam_beta1 < 1 and 0 <= self.adam_beta2 < 1, "adam betas must be in [0, 1)"),
            (self.adam_epsilon > 0, "adam_epsilon must be > 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"GRPOConfig: {message}")


@dataclass(frozen=True)
class GenerationConfig:
    """How completions are sampled."""

    temperature: float = field(
        default=1.0,
        metadata={"help": "sampling temperature", "min": 0, "max": 100},
    )
    top_p: float = field(
        default=1.0, metadata={"help": "Nucleus sampling: keep the smallest token set with this mass, in (0, 1]."}
    )
    max_new_tokens: int = field(
        default=1,  # the built-in tiny models answer in one token; see node.training.models.ModelDefaults
        metadata={"help": "tokens per completion", "min": 1, "max": 4096},
    )
    sample_precision: str = field(
        default="auto",
        metadata={
            "help": (
                "weights that sample: auto (bfloat16 where the CPU has native bf16 and the node trains an"
                " adapter on a model of 10M+ parameters; training and held-out scoring stay float32), "
                "float32, bfloat16"
            ),
            "choices": PRECISIONS,
        },
    )

    def __post_init__(self) -> None:
        check_declared(self)  # temperature, max_new_tokens and sample_precision
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass(frozen=True)
class AdapterConfig:
    """Which adapter a node trains (``adapter="none"``: every weight, no adapter)."""

    adapter: str = field(
        default="none",
        metadata={
            "help": (
                "none (train every weight) or lora (train low-rank adapters on the frozen model: a "
                "fraction of the memory; only the adapters are checkpointed and averaged)"
            ),
            "choices": ADAPTERS,
        },
    )
    lora_rank: int = field(
        default=16,
        metadata={"help": "rank r of each adapter", "min": 1, "max": 4096},
    )
    lora_alpha: int = field(
        default=32,
        metadata={"help": "adapter scale: its update is multiplied by alpha / r", "min": 1, "max": 65536},
    )
    lora_dropout: float = field(
        default=0.0,
        metadata={"help": "dropout on the adapters' input in training passes", "min": 0, "below": 1},
    )
    lora_targets: str = field(
        default="",
        metadata={
            "help": (
                "comma list of module names to adapt (default: the attention and MLP projections the "
                "model has: q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj on Llama-family, "
                "c_attn,c_proj,c_fc on GPT-2)"
            )
        },
    )

    def __post_init__(self) -> None:
        check_declared(self)  # the adapter, its rank, alpha and dropout
        for t in self.targets:
            if not _TARGET_NAME.fullmatch(t):
                raise ValueError(f"--lora-targets: {t!r} is not a module name; use a comma list such as q_proj,v_proj")

    @property
    def targets(self) -> tuple[str, ...]:
        """The module names of ``lora_targets`` (empty: the default projections)."""
        return parse_targets(self.lora_targets)

    @property
    def enabled(self) -> bool:
        """Whether the node trains an adapter (else every weight)."""
        return self.adapter != "none"

    def describe(self, targets: tuple[str, ...]) -> str:
        """The settings that fix what the adapter weights mean, with the ``targets`` resolved on a model.

        Dropout is left out: it changes how the adapters are trained, not what their weights mean,
        so peers that differ only in dropout may still average and resume each other's checkpoints.

        >>> AdapterConfig("lora", lora_rank=8, lora_alpha=16).describe(("v_proj", "q_proj"))
        'lora r=8 alpha=16 on q_proj,v_proj'
        """
        return f"{self.adapter} r={self.lora_rank} alpha={self.lora_alpha} on {','.join(sorted(targets))}"


@dataclass(frozen=True)
class EvalConfig:
    """When and how much a node evaluates."""

    eval_every: int = field(
        default=0,
        metadata={
            "help": "rounds between held-out evaluations, also run before the first round and after the last; 0: off",
            "min": 0,
        },
    )
    eval_items: int = field(
        default=64,
        metadata={"help": "held-out questions per task family", "min": 1, "max": 4096},
    )
    eval_samples: int = field(
        default=8,
        metadata={
            "help": (
                "sampled completions per held-out question, for the mean reward beside greedy accuracy (0: greedy only)"
            ),
            "min": 0,
            "max": 64,
        },
    )
    eval_timeout_s: float = field(
        default=60.0,
        metadata={"help": "longest one evaluation runs (s); past it the scores cover the questions done", "above": 0},
    )

    def __post_init__(self) -> None:
        check_declared(self)

    def due(self, round: int, last_round: int) -> bool:
        """Whether to evaluate after ``round`` (0: before the first): every ``eval_every`` rounds and after the last."""
        if self.eval_every <= 0:
            return False
        return round % self.eval_every == 0 or (last_round > 0 and round == last_round)


def parse_targets(text: str) -> tuple[str, ...]:
    """``--lora-targets``' comma list as names (empty text: the default projections).

    >>> parse_targets(" q_proj, v_proj "), parse_targets("")
    (('q_proj', 'v_proj'), ())
    """
    if not text.strip():
        return ()
    names = tuple(t.strip() for t in text.split(","))
    if not all(names):
        raise ValueError(f"--lora-targets {text}: an empty name; use a comma list such as q_proj,v_proj")
    return names
