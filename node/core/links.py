"""A node's network collaborators, behind small protocols, and the factory that builds the real ones.

:class:`~node.core.node.Node` never constructs hivemind objects itself. Once
its identity is loaded it asks a :data:`LinksFactory` to join the swarm,
which gives a :class:`Joining`: the node listens and takes part in the DHT
while it loads its model (seconds of imports and weights). Once the model is
loaded, :meth:`Joining.links` starts what speaks for the node: the rollout
exchange and the optional outer sync, whose namespace is the model's
fingerprint. Until then the node publishes nothing and serves no payload. The
default, :func:`hivemind_links`, joins the hivemind swarm; tests pass a factory
whose links are an in-process exchange, so a whole round runs without
processes or sockets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from node.core.config import NodeParts
from protocol import RolloutBatch
from swarm.exchange import CollectResult, RolloutExchange
from swarm.identity import Identity
from swarm.membership import Membership
from swarm.sync import OuterSync, OuterSyncConfig, SyncReport
from swarm.sync.runner import SyncRunner
from swarm.validation import SignedRecordValidator, swarm_record_validator


class Exchange(Protocol):
    """What a round needs from the rollout exchange (see :class:`swarm.exchange.RolloutExchange`)."""

    round: int

    def publish(self, batch: RolloutBatch) -> object: ...

    def collect(self, since: float, limit: int) -> CollectResult: ...

    def stats(self) -> dict[str, int]: ...

    def judge(self, publisher: str, *, accepted: int, informative: int, refused: int) -> None:
        """Feedback after re-verifying ``publisher``'s groups this round (see ``PublisherTally``)."""
        ...

    def reputation_summary(self) -> dict[str, Any]:
        """JSON-able: ``tracked``, ``banned``, ``bans_by_reason``."""
        ...

    def close(self) -> None: ...


class Sync(Protocol):
    """What a round needs from the outer sync (see :class:`swarm.sync.runner.SyncRunner`)."""

    @property
    def busy(self) -> bool: ...

    def maybe_sync(self, inner_step: int) -> SyncReport | None: ...

    def finish(self, timeout_s: float) -> SyncReport | None: ...

    def cancel(self) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


@dataclass
class Links:
    """The collaborators of a started node; ``leave`` disconnects from the swarm (after the others closed)."""

    exchange: Exchange
    sync: Sync | None = None
    multiaddrs: Callable[[], list[str]] = list
    leave: Callable[[], None] = lambda: None
    membership: Membership | None = field(default=None, repr=False)


class Joining(Protocol):
    """A node in the swarm whose model is not loaded yet: listening and in the DHT, publishing nothing."""

    def multiaddrs(self) -> list[str]: ...

    def links(self, model: torch.nn.Module) -> Links:
        """Start the exchange and, if configured, the outer sync of ``model``; their ``leave`` leaves the swarm."""
        ...

    def leave(self) -> None:
        """Leave the swarm when :meth:`links` never returned (a start that failed in between)."""
        ...


LinksFactory = Callable[[Identity, NodeParts, Callable[[], float]], Joining]
"""(identity, configs, clock) -> the node listening in the swarm; its links come once its model is loaded."""


def swarm_validator(parts: NodeParts) -> SignedRecordValidator:
    """One DHT validator for every signed record kind a node stores (all nodes must agree).

    It binds records to the swarm id, the exchange's window width and the outer
    sync's record lifetimes (the defaults' when this node does not sync): swarm-wide
    settings, so every node of a swarm refuses and accepts the same records.
    """
    sync = parts.sync if parts.sync is not None else OuterSyncConfig()
    return swarm_record_validator(parts.membership.swarm_id, parts.exchange.window_s, sync)


@dataclass
class HivemindJoining:
    """The hivemind swarm joined (membership started); the exchange and sync wait for the model."""

    membership: Membership
    parts: NodeParts
    clock: Callable[[], float]

    def multiaddrs(self) -> list[str]:
        return self.membership.visible_multiaddrs()

    def links(self, model: torch.nn.Module) -> Links:
        membership, parts, clock = self.membership, self.parts, self.clock
        try:
            exchange = RolloutExchange(membership, parts.exchange, clock=clock)
            exchange.start()
            sync = None
            if parts.sync is not None:
                sync = SyncRunner(OuterSync(membership, model, parts.sync, clock=clock), clock=clock)
        except BaseException:
            membership.shutdown()
            raise
        return Links(exchange, sync, membership.visible_multiaddrs, membership.shutdown, membership)

    def leave(self) -> None:
        self.membership.shutdown()


def hivemind_links(identity: Identity, parts: NodeParts, clock: Callable[[], float]) -> HivemindJoining:
    """Join the swarm: start the membership (bounded bootstrap); the rollout exchange and, if configured, the
    outer sync start from :meth:`HivemindJoining.links` once the model is loaded."""
    membership = Membership(identity, parts.membership, [swarm_validator(parts)]).start()
    return HivemindJoining(membership, parts, clock)
