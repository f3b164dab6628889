"""The node's own config and node.core's component configs that its options feed: checkpoints', ingest's.

Standard library only at import, so the command line reads their fields' help, defaults and ranges
(:mod:`node.core.options`) without loading torch or hivemind. Each option-fed field declares its help,
and its range (``min``/``max`` inclusive, ``above``/``below`` exclusive) and ``choices`` where it has
them, in its metadata, the one statement of them: each ``__post_init__`` checks them with
:func:`swarm.declared.check_declared` and states only what a declaration cannot. :mod:`node.core.config`,
``checkpoint`` and ``ingest`` re-export them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from node.core.pool import SAMPLING_POLICIES
from swarm.declared import check_declared

DEFAULT_MODEL = "tiny-s"
DEFAULT_IDENTITY = "~/.swarm-node/identity.key"
REPORT_TO = ("none", "tensorboard", "wandb")
"""Where ``--report-to`` also logs per-round scalars (TRL's ``report_to``): each but none is an optional package."""
DEVICES = ("auto", "cpu", "cuda", "mps")


@dataclass
class NodeConfig:
    """What one node trains, on what, and how it shares."""

    model: str = field(
        default=DEFAULT_MODEL,
        metadata={"help": "built-in model name or local HF model folder"},
    )
    tasks: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": (
                "task family (repeatable; default: the model's: the tiny built-ins for a tiny model, the "
                "reasoning-gym families where it gets a learning signal for a real LM)"
            )
        },
    )
    accept_tasks: tuple[str, ...] = field(
        default=(),
        metadata={"help": "task family learned from peers' groups without generating it (repeatable)"},
    )
    seed: int = field(
        default=0,
        metadata={
            "help": (
                "seed for sampling, generation and the initial weights (with the outer sync on, every "
                "peer of one model starts from the same weights)"
            )
        },
    )
    rounds: int = field(
        default=0,
        metadata={"help": "rounds to run; 0 runs until stopped", "min": 0},
    )
    warm_start_steps: int = field(
        default=0,
        metadata={
            "help": (
                "supervised steps on gold answers before the first round, the same on every node (a "
                "stand-in for a pretrained model: all nodes of one model and task set start from one "
                "prior); 0: off"
            ),
            "min": 0,
            "max": 100000,
        },
    )
    local_groups: int = field(
        default=4,
        metadata={"help": "I: local groups per round", "min": 1},
    )
    external_groups: int = field(
        default=4,
        metadata={"help": "J: external groups per round", "min": 0},
    )
    num_generations: int = field(
        default=8,
        metadata={"help": "G: completions per question", "min": 2, "max": 64},
    )
    sampling: str = field(
        default="advantage",
        metadata={
            "help": (
                "external group choice: uniform, advantage (groups with signal first) or credit (then by "
                "what their sources taught this node)"
            ),
            "choices": SAMPLING_POLICIES,
        },
    )
    max_source_share: float = field(
        default=0.5,
        metadata={
            "help": (
                "most rows one peer may supply to a training step, as a share of this node's own rows (I "
                "x G); with each peer group cut to G completions and its mean |advantage| at most 1, it "
                "bounds that peer's share of the step's advantage mass too"
            ),
            "max": 16,
            "above": 0,
        },
    )
    pool_capacity: int = field(default=64, metadata={"help": "Most verified external groups kept waiting."})
    collect_limit: int = field(default=8, metadata={"help": "Most peer batches fetched per round."})
    share: bool = field(default=True, metadata={"help": "Publish local rollouts for other peers."})
    overlap_network: bool = field(
        default=True,
        metadata={
            "help": (
                "publish and collect beside the rounds, on by default; this flag makes each round wait "
                "for its own publish and collect"
            )
        },
    )
    network_wait_s: float = field(
        default=0.05,
        metadata={
            "help": (
                "longest a round waits for the collect it started (s; at most its own generation time); a"
                " slower one is ingested later"
            ),
            "min": 0,
            "max": 60,
        },
    )
    min_generate_s: float = field(
        default=0.0,
        metadata={
            "help": (
                "shortest a round's generation lasts (s): a faster node waits out the rest before "
                "sharing, as a bigger model would, so a local swarm of tiny models keeps a real swarm's "
                "round length (0: off)"
            ),
            "min": 0,
            "max": 3600,
        },
    )
    log_dir: str = field(
        default="runs",
        metadata={"help": "metrics go to <log-dir>/<peer-short-id>/metrics.jsonl"},
    )
    device: str = field(
        default="auto",
        metadata={"help": "where the model runs (auto: cuda, then mps, then cpu)", "choices": DEVICES},
    )
    max_threads: int = field(
        default=0,
        metadata={"help": "cap torch CPU threads (0: torch default)", "min": 0},
    )
    report_to: str = field(
        default="none",
        metadata={
            "help": (
                "also log per-round scalars (reward, held-out accuracy, groups used, sync commits; step: "
                "the round) to tensorboard (files in <log-dir>/<peer-short-id>/tensorboard) or wandb; "
                "each needs its package"
            ),
            "choices": REPORT_TO,
        },
    )
    identity: str = field(
        default=DEFAULT_IDENTITY,
        metadata={"help": "Ed25519 key file (created if missing)"},
    )
    diagnose_groups: bool = field(
        default=False,
        metadata={"help": ("record per round and source what training used (log-probs, weights, gradient shares)")},
    )
    share_logprobs: bool = field(
        default=True,
        metadata={"help": "Publish each completion's sequence log-probability (one scoring pass per round)."},
    )

    def __post_init__(self) -> None:
        check_declared(self)  # each field's range and choices, from its declaration above
        checks = [
            (
                self.max_source_share * self.local_groups >= 1,
                f"max_source_share={self.max_source_share} with local_groups={self.local_groups} lets a peer supply "
                f"less than one group of G completions, so no peer's group would ever be trained on; use at least "
                f"1/{self.local_groups}",
            ),
            (self.pool_capacity >= 1, f"pool_capacity={self.pool_capacity}; use at least 1"),
            (self.collect_limit >= 0, f"collect_limit={self.collect_limit}; use 0 or more"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(msg)

    @property
    def isolated(self) -> bool:
        """A node that neither takes nor needs external groups."""
        return self.external_groups == 0


@dataclass(frozen=True)
class CheckpointConfig:
    """When the node writes checkpoints and whether it starts from one."""

    checkpoint_every: int = field(
        default=50,
        metadata={"help": "rounds between checkpoints (also written on leave); 0: off", "min": 0},
    )
    resume: bool = field(
        default=False,
        metadata={"help": "continue from the latest intact checkpoint in the log dir"},
    )

    def __post_init__(self) -> None:
        check_declared(self)


@dataclass(frozen=True)
class IngestConfig:
    """Per-round bounds on re-verifying peers' groups (all refusals past them are counted)."""

    max_groups_per_publisher: int = field(
        default=16,
        metadata={"help": "Groups of one publisher verified per round (an honest batch has local_groups, 4)."},
    )
    # A build costs < 0.1 ms (chain_sum, gcd, ...) to ~20-100 ms (spell_backward reads a word list), see
    # node.tasks.reasoning_gym: 4 keep a tiny node's round within ~0.1-0.4 s of its 0.04 s under a flood of
    # new seeds (measured 0.21 s with 8), while an honest peer, one seed per family, is built once and cached.
    max_task_builds: int = field(
        default=4, metadata={"help": "Expensive task regenerations (new reasoning-gym datasets) per round."}
    )
    max_task_builds_per_publisher: int = field(
        default=2, metadata={"help": "Of those, at most this many caused by one publisher per round."}
    )
    max_ingest_s: float = field(
        default=1.0, metadata={"help": "Seconds one round may spend re-verifying; later groups are refused."}
    )
    accept_tokens: int = field(
        default=0,
        metadata={
            "help": "longest peer completion accepted, in this model's tokens (0: its own --max-new-tokens)",
            "min": 0,
        },
    )
    completion_slack_tokens: int = field(
        default=2,
        metadata={
            "help": "Tokens a peer's completion may exceed this node's max_new_tokens by: re-tokenising "
            "decoded text can add one or two (a character cut mid-way decodes to U+FFFD)."
        },
    )

    def __post_init__(self) -> None:
        check_declared(self)  # accept_tokens' range
        counts = ("max_groups_per_publisher", "max_task_builds", "max_task_builds_per_publisher")
        for name in counts:
            if getattr(self, name) < 0:
                raise ValueError(f"IngestConfig.{name}={getattr(self, name)}; use 0 (refuse all) or more")
        if not 0 < self.max_ingest_s <= 600:
            raise ValueError(f"IngestConfig.max_ingest_s={self.max_ingest_s}; use seconds in (0, 600]")
        if not 0 <= self.completion_slack_tokens <= 64:
            raise ValueError(f"IngestConfig.completion_slack_tokens={self.completion_slack_tokens}; use 0-64")
