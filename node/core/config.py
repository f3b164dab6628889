"""The node's configuration: its own fields plus each component's config dataclass.

One source of truth: the CLI builds this object from flags; nothing reads
environment variables behind its back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from node.core.checkpoint import CheckpointConfig
from node.core.configs import DEVICES as DEVICES
from node.core.configs import NodeConfig as NodeConfig
from node.core.ingest import IngestConfig
from node.training.adapters import AdapterConfig
from node.training.evaluate import EvalConfig
from node.training.grpo import GRPOConfig
from node.training.offpolicy import OffPolicyConfig
from node.training.policy import GenerationConfig
from swarm.exchange import ExchangeConfig
from swarm.membership import MembershipConfig
from swarm.sync import OuterSyncConfig


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
