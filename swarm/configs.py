"""The swarm layer's configs that a node's options feed: the outer sync's and the membership's.

Standard library only at import, so the command line reads their fields' help, defaults and ranges
(:mod:`node.core.options`) without loading hivemind or torch. Each option-fed field declares its help, and
its range (``min``/``max`` inclusive, ``above``/``below`` exclusive, ``or_zero``) and ``choices`` where it
has them, in its metadata, the one statement of them: each ``__post_init__`` checks them with
:func:`swarm.declared.check_declared` and states only what a declaration cannot. The time bound a sync may
take is :meth:`OuterSyncConfig.max_sync_seconds` (derived in :mod:`swarm.sync.outer`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from swarm.declared import check_declared
from swarm.maddr import parse_announce, parse_peer_multiaddr

if TYPE_CHECKING:
    from swarm.dht_storage import StorageBudget

COMPRESSIONS = ("none", "fp16", "int8")
AGGREGATORS = ("mean", "trimmed_mean", "median", "centered_clip")
BYTES_PER_ELEMENT = {"none": 4.0, "fp16": 2.0, "int8": 1.0 + 4 / 4096}
"""Wire bytes per parameter of each encoding (int8: one float32 scale per 4,096 values)."""


RULE_FIELDS = (
    "outer_lr", "outer_momentum", "nesterov", "aggregator", "trim_fraction", "clip_factor", "max_weight_ratio",
    "max_update",
)  # fmt: skip
"""The settings that decide a round's new state from its members' parts (see :meth:`OuterSyncConfig.rule`)."""
ALLREDUCE_WIRE = 2
"""The all-reduce's wire format (2: parts and reduced slices streamed piece by piece, each part claiming its
norm: :mod:`swarm.sync.pieces`); in the rule, so peers of different formats never meet in a group."""


MAX_WINDOW_FACTOR = 3.0
"""A gather window lasts at most this x ``matchmaking_timeout_s``, whatever length its opener asked for
(``swarm.sync.decide.window_for``: a peer whose syncs run slower opens longer windows)."""


@dataclass
class OuterSyncConfig:
    """How often and how (robustly, with which bounds) peers of one architecture average."""

    sync_every: int = field(
        default=100,
        metadata={"help": "rounds between outer syncs", "min": 0},
    )
    sync_period_s: float = field(
        default=0.0,
        metadata={
            "help": (
                "sync on a shared clock instead: every peer of an architecture starts a sync at each "
                "multiple of this many seconds of wall time, so peers of different speeds meet (turns the"
                " sync on; e.g. 60)"
            ),
            "min": 1,
            "or_zero": True,
        },
    )
    eager: bool = field(
        default=True,
        metadata={
            "help": (
                "run each sync beside training and apply it one step late, on by default; this flag makes"
                " training wait for each sync"
            )
        },
    )
    outer_lr: float = field(
        default=0.7,
        metadata={"help": "outer SGD learning rate; DiLoCo's pretraining setting is 0.7 with momentum 0.9", "above": 0},
    )
    outer_momentum: float = field(
        default=0.9,
        metadata={
            "help": "outer (Nesterov) SGD momentum; 0 with --outer-lr 1: the outer step is plain averaging",
            "min": 0,
            "below": 1,
        },
    )
    nesterov: bool = field(default=True, metadata={"help": "Use Nesterov momentum in the outer step."})
    compression: str = field(
        default="none",
        metadata={"help": "wire encoding of the all-reduce", "choices": COMPRESSIONS},
    )
    aggregator: str = field(
        default="centered_clip",
        metadata={
            "help": (
                "how a reducer combines the (norm-clipped) parts: centered_clip, median, trimmed_mean "
                "(robust to one member reversing the group's progress, from 3 members up) or mean"
            ),
            "choices": AGGREGATORS,
        },
    )
    trim_fraction: float = field(
        default=0.2, metadata={"help": "Fraction trimmed from each end by trimmed_mean, in [0, 0.5)."}
    )
    clip_factor: float = field(
        default=4.0,
        metadata={
            "help": "Norm bound on contributions: a reducer clips a part longer than clip_factor x the median "
            "part norm of its slice (x its own part's norm with 2 parts), and a member votes abort on a "
            "reduced slice longer than clip_factor x its own part. Higher tolerates more honest spread "
            "but lets a poisoner move the average further; > 1."
        },
    )
    max_weight_ratio: float = field(
        default=4.0,
        metadata={
            "help": "Each member's part counts by the inner steps it trained since the anchor, but a reducer "
            "counts a claim as at most this x the median claim of its slice (x the smaller, with 2 parts): "
            "any key can claim any step count. Higher lets much faster peers count fully but lets a liar "
            "move the average further; >= 1."
        },
    )
    suspect_ban_s: float = field(
        default=600.0,
        metadata={
            "help": "Seconds this peer leaves out of its sync groups a member whose reduced slice failed the "
            "check (non-finite or too large), whose part was garbage, or that kept aborting rounds the others "
            "would commit: any of them would otherwise make every round abort."
        },
    )
    matchmaking_timeout_s: float = field(
        default=5.0,
        metadata={
            "help": "gather window: peers arriving within it form a group (s); a peer whose all-reduces are slow "
            "opens windows up to 3x as long (3x their median)",
            "above": 0,
        },
    )
    allreduce_timeout_s: float = field(
        default=60.0,
        metadata={
            "help": (
                "bound on one sync's all-reduce (s); grows for a model whose bytes take longer at --sync-min-mbit"
            ),
            "min": 5,
        },
    )
    direct_payloads: bool = field(
        default=True,
        metadata={
            "help": (
                "move the all-reduce's bytes on direct TCP connections, on by default (each payload's "
                "sha256 checked over the P2P stream; about a third of the CPU, not encrypted); this flag "
                "moves them on the encrypted P2P streams only"
            )
        },
    )
    chunk_timeout_s: float = field(
        default=10.0, metadata={"help": "Bound on moving any one 1 MiB chunk (or header) on a stream."}
    )
    commit_timeout_s: float = field(
        default=5.0, metadata={"help": "Time after the all-reduce deadline for every member's commit vote."}
    )
    dht_timeout_s: float = field(
        default=5.0,
        metadata={
            "help": "Bound on any single DHT get or store; keep it above hivemind's RPC wait_timeout "
            "(3 s) so a read that meets a frozen DHT node still returns the other nodes' records."
        },
    )
    ping_timeout_s: float = field(
        default=2.0,
        metadata={
            "help": "Bound on a liveness ping: a joiner that does not answer one within it is left out of the "
            "group, and a member whose vote is missing and that does not answer makes the round abort."
        },
    )
    state_timeout_s: float = field(
        default=60.0, metadata={"help": "Bound on downloading the group's state when catching up."}
    )
    max_state_serves: int = field(
        default=4,
        metadata={
            "help": "State downloads this peer serves at once (one per asking peer): an ask past it is refused "
            "at once and the asker tries its next donor. Every download shares one copy of the state's bytes, "
            "but also the link: each must finish within the state download bound. >= 1."
        },
    )
    min_link_mbit: float = field(
        default=20.0,
        metadata={
            "help": (
                "slowest link (Mbit/s each way) a sync member is expected to have: the all-reduce and "
                "state download bounds grow to what the model's bytes take at this rate"
            ),
            "above": 0,
        },
    )
    max_state_shift: float = field(
        default=1.0,
        metadata={
            "help": "Catch-up refuses a downloaded state whose anchor differs from this peer's own by more "
            "than this x the norm of its own anchor (and whose momentum is over that / (1 - outer_momentum)). "
            "Higher lets a peer far behind catch up; lower limits how far a hostile donor can move it; > 0."
        },
    )
    max_update: float = field(
        default=0.5,
        metadata={
            "help": "Floor of the reduced-slice and outer-step checks for a member with no evidence of an "
            "honest average's scale (its parts and committed averages all below 1e-4 of the anchor's norm: its "
            "groups had no signal since it started): max_update x the anchor's norm (per slice: its share). "
            "Every other member judges by its own evidence (swarm.sync.assemble). > 0."
        },
    )
    min_group_size: int = field(default=2, metadata={"help": "Fewest peers (self included) to sync with."})
    max_group_size: int = field(default=64, metadata={"help": "Most peers in one sync group."})
    poll_s: float = field(default=0.1, metadata={"help": "Interval between DHT polls while waiting."})
    record_ttl_s: float = field(default=600.0, metadata={"help": "Lifetime of this peer's state record in the DHT."})

    def __post_init__(self) -> None:
        # allreduce_timeout_s declares the command line's floor (the default dht_timeout_s); a sync of faster
        # DHT bounds may take less, and its own rule, A >= d, is checked below
        check_declared(self, skip=("allreduce_timeout_s",))
        if self.sync_every < (0 if self.sync_period_s else 1):
            raise ValueError(f"sync_every={self.sync_every}; use at least 1 (typical: 100-500), or a sync_period_s")
        if not math.isfinite(self.sync_period_s):  # a declared range admits infinity
            raise ValueError(f"sync_period_s={self.sync_period_s}; use 0 (count inner steps) or at least 1 second")
        if not 0.0 <= self.trim_fraction < 0.5:
            raise ValueError(f"trim_fraction={self.trim_fraction}; use a value in [0, 0.5), e.g. 0.2")
        if not (math.isfinite(self.clip_factor) and self.clip_factor > 1.0):
            raise ValueError(f"clip_factor={self.clip_factor}; use a finite number above 1 (typical: 2-10)")
        if not (math.isfinite(self.max_weight_ratio) and self.max_weight_ratio >= 1.0):
            raise ValueError(
                f"max_weight_ratio={self.max_weight_ratio}; use a finite number of at least 1 (typical: 2-8)"
            )
        if not math.isfinite(self.outer_lr):
            raise ValueError(f"outer_lr={self.outer_lr}; use a finite positive number (DiLoCo: 0.7)")
        for name in (
            "matchmaking_timeout_s",
            "allreduce_timeout_s",
            "chunk_timeout_s",
            "commit_timeout_s",
            "dht_timeout_s",
            "state_timeout_s",
            "ping_timeout_s",
            "poll_s",
            "record_ttl_s",
            "suspect_ban_s",
            "min_link_mbit",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name}={value}; use a positive number of seconds")
        if self.allreduce_timeout_s < self.dht_timeout_s:
            raise ValueError(
                f"allreduce_timeout_s={self.allreduce_timeout_s} < dht_timeout_s={self.dht_timeout_s}; "
                "raise allreduce_timeout_s (the documented time bound assumes A >= d)"
            )
        if not (math.isfinite(self.max_update) and self.max_update > 0):
            raise ValueError(f"max_update={self.max_update}; use a positive number (default 0.5)")
        if not (math.isfinite(self.max_state_shift) and self.max_state_shift > 0):
            raise ValueError(f"max_state_shift={self.max_state_shift}; use a positive number (default 1.0)")
        if self.max_state_serves < 1:
            raise ValueError(f"max_state_serves={self.max_state_serves}; use at least 1 (default 4)")
        if self.min_group_size < 2:
            raise ValueError(f"min_group_size={self.min_group_size}; use at least 2 (yourself and a peer)")
        if self.max_group_size < self.min_group_size:
            raise ValueError(f"max_group_size={self.max_group_size} < min_group_size={self.min_group_size}; raise it")

    def rule(self) -> str:
        """The settings every member of a group must share to compute one new state from one average.

        Members whose outer step or aggregation differ would each commit a different state and their
        digests could never agree, so every round they met in would abort; the sync namespace
        carries this rule (:func:`swarm.fingerprint.sync_fingerprint`) and they never meet. The wire
        encoding is in the join key already.
        """
        return ",".join(f"{name}={getattr(self, name)!r}" for name in RULE_FIELDS) + f",wire={ALLREDUCE_WIRE}"

    def transfer_s(self, nbytes: float) -> float:
        """Seconds ``nbytes`` take each way at ``min_link_mbit``, a quarter more for headers and acknowledgements."""
        return 1.25 * nbytes * 8 / (self.min_link_mbit * 1e6)

    def allreduce_bound_s(self, n_elems: int) -> float:
        """Bound on one all-reduce of ``n_elems`` parameters: what a member's bytes take on the slowest link,
        at least ``allreduce_timeout_s``. A member sends, and receives, 2 (N - 1) / N < 2 times the encoded
        model (its parts, then the reduced slice to every other member)."""
        per_element = BYTES_PER_ELEMENT[self.compression]
        return max(self.allreduce_timeout_s, self.transfer_s(2 * per_element * n_elems))

    def momentum_elems(self, n_elems: int) -> int:
        """Values of the outer momentum a state of ``n_elems`` parameters holds: none without momentum.

        With ``outer_momentum`` 0 the step never reads the buffer (it would only copy the last average),
        so the state is the anchor alone: a model's size less at rest, in every round and in every
        catch-up download. The rule is in the sync namespace, so every peer a node meets agrees.
        """
        return n_elems if self.outer_momentum > 0 else 0

    def state_bound_s(self, n_elems: int) -> float:
        """Bound on downloading a state (anchor and any momentum, float32) of ``n_elems`` parameters."""
        return max(self.state_timeout_s, self.transfer_s(4 * (n_elems + self.momentum_elems(n_elems))))

    def max_sync_seconds(self, n_elems: int) -> float:
        """Upper bound on one ``sync_now`` (catch-up included) for a model of ``n_elems`` parameters; see
        :mod:`swarm.sync.outer` (:meth:`OuterSync.max_sync_seconds` passes its own model's size)."""
        d = self.dht_timeout_s
        window = MAX_WINDOW_FACTOR * self.matchmaking_timeout_s  # the longest a window's opener may ask for
        round_s = window + self.allreduce_bound_s(n_elems) + max(self.commit_timeout_s, d)
        # three ping rounds: the catch-up check's (trusted peers at this state), the merge check's (peers of
        # this and other histories) and the orphan check's
        return round_s + self.state_bound_s(n_elems) + 3 * self.ping_timeout_s + 6 * d + 1.0


@dataclass
class MembershipConfig:
    """How this node listens and whom it joins through."""

    swarm_id: str = field(
        default="swarm-node",
        metadata={"help": "swarm name; keys are namespaced by it"},
    )
    host: str = field(default="0.0.0.0", metadata={"help": "IPv4 address to listen on."})
    port: int = field(default=0, metadata={"help": "TCP port to listen on; 0 picks a free one."})
    announce: tuple[str, ...] = field(
        default=(),
        metadata={"help": "multiaddr to announce (repeatable)"},
    )
    initial_peers: tuple[str, ...] = field(default=(), metadata={"help": "Multiaddrs of peers to join through."})
    client_mode: bool = field(
        default=False,
        metadata={"help": "accept no incoming connections (behind NAT)"},
    )
    use_relay: bool = field(
        default=True,
        metadata={
            "help": "relay for peers behind NAT and reach them through relays (libp2p circuits, the outer sync's "
            "pipes), on by default; this flag turns both off"
        },
    )
    use_auto_relay: bool = field(
        default=False,
        metadata={
            "help": "look for a relay to be reachable through even with a public address (a node that listens "
            "only on private addresses and joins through peers does so anyway)"
        },
    )
    address_book: bool = field(
        default=True,
        metadata={"help": "Keep peers seen in <identity>.peers.json and rejoin through them when --peers are gone."},
    )
    address_book_every_s: float = field(default=30.0, metadata={"help": "Longest wait between address book updates."})
    bootstrap_attempts: int = field(
        default=4,
        metadata={"help": "tries to reach --peer (backoff 1 s, doubling)", "min": 1},
    )
    # A joiner hears its first peer's batches within a few rounds (seconds); a minute also covers a real
    # model's first round on a CPU, so a node merely slow to start is not called alone.
    alone_after_s: float = field(
        default=60.0,
        metadata={
            "help": "seconds without a batch from a peer of this swarm before the node warns that it trains alone",
            "above": 0,
        },
    )
    bootstrap_backoff_s: float = field(default=1.0, metadata={"help": "First wait between tries; doubles each time."})
    startup_timeout_s: float = field(default=30.0, metadata={"help": "Bound on starting the DHT process."})
    shutdown_timeout_s: float = field(default=5.0, metadata={"help": "Bound on a clean shutdown."})
    # DHT memory bounds (swarm.dht_storage). Sized from the protocol: a descriptor is <= 2 KiB
    # (~0.75 KiB charged for a typical one, overhead included), lives 300 s in windows of 30 s, so
    # about 11 window keys are alive at once; sync records are <= 1 KiB.
    dht_key_bytes: int = field(
        default=1024 * 1024,
        metadata={
            "help": "Most bytes one DHT key may hold here (~1,400 typical descriptors, ~430 of the largest); "
            "keeps every key far below hivemind's 4 MiB message cap, above which nobody can read it."
        },
    )
    dht_key_subkeys: int = field(default=2048, metadata={"help": "Most subkeys (publishers) one DHT key may hold."})
    dht_storage_bytes: int = field(
        default=32 * 1024 * 1024,
        metadata={
            "help": "Byte budget of the DHT records this node stores for the swarm (11 full window keys and "
            "the sync keys take ~12 MiB); above it the records expiring soonest are evicted."
        },
    )
    dht_cache_bytes: int = field(
        default=8 * 1024 * 1024, metadata={"help": "Byte budget of this node's cache of DHT lookup results."}
    )
    dht_cache_keys: int = field(
        default=512, metadata={"help": "Most keys in the DHT lookup cache (hivemind's cache_size)."}
    )
    dht_owners_only: bool = field(
        default=True,
        metadata={
            "help": "Keep a record another peer stores here only if that peer signed it (its subkey): a flood "
            "of records from minted keys then needs one live host per record (swarm.dht_storage)."
        },
    )
    # Per-sender quota, sized from what one honest peer keeps alive on a replica (with few nodes, every
    # replica holds every key): its state record (~0.9 KiB charged), the join and vote records of its rounds
    # of the last ~95 s (~0.8 KiB each; ~19 + 19 at one round per 5 s gather window, ~70 + 70 in the tests'
    # sub-second rounds) and one descriptor per live window key and shard level (<= 2.4 KiB each: 11 windows
    # x 2 levels by default, 242 with the longest descriptor lifetime, 3600 s): ~60 entries / ~85 KiB
    # typically, ~150 at most in practice. A peer over its quota loses its own entries expiring soonest:
    # an honest one its oldest windows' descriptors and finished rounds' records, which no one reads.
    dht_sender_entries: int = field(
        default=256,
        metadata={
            "help": "Most entries the stores of one peer may hold here (an honest peer keeps ~60, ~150 with "
            "sub-second sync rounds); past it, that peer's own records expiring soonest are evicted, no one "
            "else's: one host flooding valid records of its own under made-up keys then evicts nothing honest "
            "(swarm.dht_storage)."
        },
    )
    dht_sender_bytes: int = field(
        default=1024 * 1024,
        metadata={
            "help": "Most bytes the stores of one peer may hold here (an honest peer keeps ~85 KiB, ~0.6 MiB "
            "with hour-long descriptors; at least dht_key_bytes); with dht_sender_entries, filling "
            "dht_storage_bytes takes ~25 live hosts of the largest records, ~75 of state records."
        },
    )

    def storage_budget(self) -> StorageBudget:
        """Bounds of the records this node stores for the swarm."""
        from swarm.dht_storage import StorageBudget  # hivemind's storage: only a joining node needs it

        return StorageBudget(
            self.dht_storage_bytes, self.dht_key_bytes, self.dht_key_subkeys, owners_only=self.dht_owners_only,
            sender_entries=self.dht_sender_entries, sender_bytes=self.dht_sender_bytes,
        )  # fmt: skip

    def cache_budget(self) -> StorageBudget:
        """Bounds of this node's lookup cache (remote peers write none of it, so no sender quota is needed)."""
        from swarm.dht_storage import StorageBudget

        return StorageBudget(
            self.dht_cache_bytes, self.dht_key_bytes, self.dht_key_subkeys, self.dht_cache_keys, self.dht_owners_only
        )

    def _check_dht_bounds(self) -> None:
        if not 8192 <= self.dht_key_bytes <= 3 * 1024 * 1024:
            raise ValueError(
                f"dht_key_bytes={self.dht_key_bytes}; use 8192..3145728 (a key above hivemind's 4 MiB "
                "message cap cannot be read back), e.g. 1048576"
            )
        for name in ("dht_storage_bytes", "dht_cache_bytes"):
            if getattr(self, name) < self.dht_key_bytes:
                raise ValueError(f"{name}={getattr(self, name)} < dht_key_bytes={self.dht_key_bytes}; raise {name}")
        for name in ("dht_key_subkeys", "dht_cache_keys", "dht_sender_entries"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}; use at least 1")
        if self.dht_sender_bytes < self.dht_key_bytes:  # the largest record a key admits must fit one quota
            raise ValueError(
                f"dht_sender_bytes={self.dht_sender_bytes} < dht_key_bytes={self.dht_key_bytes}; "
                "raise dht_sender_bytes (e.g. 1048576)"
            )

    def __post_init__(self) -> None:
        check_declared(self)  # alone_after_s and bootstrap_attempts
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port {self.port} is out of range; use 0-65535 (0 picks a free port)")
        if not self.swarm_id or "/" in self.swarm_id or ":" in self.swarm_id:
            raise ValueError(f"swarm id {self.swarm_id!r} must be non-empty without '/' or ':'")
        self._check_dht_bounds()
        for m in self.initial_peers:
            parse_peer_multiaddr(m)
        for m in self.announce:
            parse_announce(m)
