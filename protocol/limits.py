"""Hard limits of the wire protocol.

Every number a peer could use to make another peer allocate memory or CPU is
capped here, and checked *before* decoding where possible.
"""

from __future__ import annotations

PROTOCOL_VERSION = 1
"""Version stamped into every message; peers refuse any other value."""

MAX_PAYLOAD_BYTES = 8 * 1024 * 1024
"""Largest encoded rollout batch (signed envelope included)."""

MAX_DESCRIPTOR_BYTES = 2048
"""Largest encoded descriptor; descriptors live in the DHT, which must stay small."""

MAX_GROUPS_PER_BATCH = 64
"""Most rollout groups one batch may carry."""

MAX_COMPLETIONS = 64
"""Most completions (G) one group may carry."""

MAX_TEXT_CHARS = 16_384
"""Longest prompt or completion text, in characters."""

MAX_NEG_LOGPROB = 1e6
"""Most negative sequence log-probability a group may claim (a completion's text is bounded too)."""

MAX_ID_CHARS = 128
"""Longest identifier: model id, task family, config digest, peer id."""

MAX_TASK_CONFIG_ENTRIES = 32
"""Most entries in a task reference's config map."""

MAX_TASK_FAMILIES = 32
"""Most task families listed in one descriptor."""

MAX_CLOCK_SKEW_S = 120.0
"""How far in the future a peer's timestamp may be before it is refused."""

MAX_DESCRIPTOR_TTL_S = 3600.0
"""Longest lifetime a descriptor may claim (expiry - created)."""
