"""The node's configuration: its own fields plus each component's config dataclass.

One source of truth: the CLI builds this object from flags; nothing reads
environment variables behind its back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from node.core.checkpoint import CheckpointConfig
from node.core.ingest import IngestConfig
from node.core.options import DEFAULT_IDENTITY, DEFAULT_MODEL
from node.core.pool import SAMPLING_POLICIES
from node.training.adapters import AdapterConfig
from node.training.evaluate import EvalConfig
from node.training.grpo import GRPOConfig
from node.training.offpolicy import OffPolicyConfig
from node.training.policy import GenerationConfig
from swarm.exchange import ExchangeConfig
from swarm.membership import MembershipConfig
from swarm.sync import OuterSyncConfig

DEVICES = ("auto", "cpu", "cuda", "mps")


@dataclass
class NodeConfig:
    """What one node trains, on what, and how it shares."""

    model: str = field(default=DEFAULT_MODEL, metadata={"help": "Built-in model name or a local HF model folder."})
    tasks: tuple[str, ...] = field(default=(), metadata={"help": "Task families to sample from; empty = all."})
    accept_tasks: tuple[str, ...] = field(
        default=(),
        metadata={"help": "More task families to learn from peers' groups without generating them (default config)."},
    )
    seed: int = field(default=0, metadata={"help": "Seed for model init, task sampling and generation."})
    rounds: int = field(default=0, metadata={"help": "Rounds to run before stopping; 0 runs until stopped."})
    warm_start_steps: int = field(
        default=0, metadata={"help": "Supervised steps of the shared warm start (node.training.warmstart); 0: off."}
    )
    local_groups: int = field(default=4, metadata={"help": "I: local groups (questions) generated per round."})
    external_groups: int = field(
        default=4, metadata={"help": "J: external groups trained on per round; 0 isolates the node."}
    )
    num_generations: int = field(default=8, metadata={"help": "G: completions generated per question."})
    sampling: str = field(
        default="advantage", metadata={"help": "External group choice: uniform, advantage or credit."}
    )
    max_source_share: float = field(
        default=0.5,
        metadata={
            "help": "Most rows one peer may supply to a training step, as a share of this node's own rows per round "
            "(I x G); its groups past that wait for a later step. With each peer group cut to G completions and "
            "its mean absolute advantage at most 1, this also bounds its share of the step's advantage mass."
        },
    )
    pool_capacity: int = field(default=64, metadata={"help": "Most verified external groups kept waiting."})
    collect_limit: int = field(default=8, metadata={"help": "Most peer batches fetched per round."})
    share: bool = field(default=True, metadata={"help": "Publish local rollouts for other peers."})
    overlap_network: bool = field(
        default=True,
        metadata={
            "help": "Publish and collect on threads beside the rounds; off: each round waits for its own "
            "publish and collect, however long they take."
        },
    )
    network_wait_s: float = field(
        default=0.05,
        metadata={
            "help": "Longest a round waits, after generating, for the collect it started (never longer than its "
            "generation took), and only if recent collects say it can land in that time; a slower collect (a flooded "
            "DHT, slow peers) is ingested by a later round. Bounds what the network costs a round."
        },
    )
    min_generate_s: float = field(
        default=0.0,
        metadata={
            "help": "Shortest a round's generation phase lasts: a node that generated faster waits out the rest "
            "before sharing, as a bigger model would. Lets a local swarm of tiny models keep a real swarm's round "
            "length (and its DHT load per second); 0 turns it off."
        },
    )
    log_dir: str = field(default="runs", metadata={"help": "Metrics go to <log_dir>/<peer-short-id>/."})
    device: str = field(default="auto", metadata={"help": "auto, cpu, cuda or mps."})
    max_threads: int = field(default=0, metadata={"help": "CPU threads for torch; 0 leaves torch's default."})
    report_to: str = field(
        default="none", metadata={"help": "Where per-round scalars also go: none, tensorboard or wandb."}
    )
    identity: str = field(default=DEFAULT_IDENTITY, metadata={"help": "Ed25519 key file; created on first run."})
    diagnose_groups: bool = field(
        default=False,
        metadata={"help": "Record per round, per source, what training used: log-probs, weights, gradient shares."},
    )
    share_logprobs: bool = field(
        default=True,
        metadata={"help": "Publish each completion's sequence log-probability (one scoring pass per round)."},
    )

    def __post_init__(self) -> None:
        checks = [
            (self.rounds >= 0, f"rounds={self.rounds}; use 0 (run until stopped) or a positive count"),
            (0 <= self.warm_start_steps <= 100_000, f"warm_start_steps={self.warm_start_steps}; use 0 (off) to 100000"),
            (
                self.local_groups >= 1,
                f"local_groups={self.local_groups}; a node needs at least 1 local group",
            ),
            (self.external_groups >= 0, f"external_groups={self.external_groups}; use 0 or more"),
            (2 <= self.num_generations <= 64, f"num_generations={self.num_generations}; GRPO needs 2-64"),
            (
                self.sampling in SAMPLING_POLICIES,
                f"sampling={self.sampling!r}; use one of {SAMPLING_POLICIES}",
            ),
            (
                0 < self.max_source_share <= 16,
                f"max_source_share={self.max_source_share}; use a share of the node's own rows in (0, 16], e.g. 0.5",
            ),
            (
                self.max_source_share * self.local_groups >= 1,
                f"max_source_share={self.max_source_share} with local_groups={self.local_groups} lets a peer supply "
                f"less than one group of G completions, so no peer's group would ever be trained on; use at least "
                f"1/{self.local_groups}",
            ),
            (self.pool_capacity >= 1, f"pool_capacity={self.pool_capacity}; use at least 1"),
            (self.collect_limit >= 0, f"collect_limit={self.collect_limit}; use 0 or more"),
            (0 <= self.network_wait_s <= 60, f"network_wait_s={self.network_wait_s}; use seconds in [0, 60]"),
            (0 <= self.min_generate_s <= 3600, f"min_generate_s={self.min_generate_s}; use seconds in [0, 3600]"),
            (self.device in DEVICES, f"device={self.device!r}; use one of {DEVICES}"),
            (self.max_threads >= 0, f"max_threads={self.max_threads}; use 0 (default) or a positive count"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(msg)

    @property
    def isolated(self) -> bool:
        """A node that neither takes nor needs external groups."""
        return self.external_groups == 0


@dataclass
class NodeParts:
    """Component configs of a node, each owned by its component."""

    membership: MembershipConfig = field(default_factory=MembershipConfig)
    exchange: ExchangeConfig = field(default_factory=ExchangeConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    sync: OuterSyncConfig | None = None  # None: no outer sync (SAPO sharing only)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    ingest: IngestConfig = field(default_factory=IngestConfig)
    offpolicy: OffPolicyConfig = field(default_factory=OffPolicyConfig)
    adapter: AdapterConfig = field(default_factory=AdapterConfig)  # kind "none": every weight trains
    evaluation: EvalConfig = field(default_factory=EvalConfig)  # every 0: no held-out evaluation
