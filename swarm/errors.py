"""Named failures of the networked layer."""

from __future__ import annotations


class SwarmError(RuntimeError):
    """Base class for swarm-layer failures that a caller may want to handle."""


class BootstrapFailed(SwarmError):
    """No initial peer answered; the message lists what was tried and what to do."""


class PortInUse(SwarmError):
    """The requested listen port is taken by another program."""
