"""Rate-limited links for benchmarks: each peer in its own network namespace behind a shaped veth.

A volunteer's outer sync moves most of its bytes over a 20-1,000 Mbit/s link, where loopback makes
bytes nearly free. :class:`Links` builds, for ``peers`` processes, one namespace per peer and a
switch namespace holding a bridge; peer i is ``10.99.0.(i+1)`` on a veth whose two ends both carry a
token bucket (``tc qdisc ... tbf``) at the link's rate, so the peer's upload and its download are each
limited, as on a symmetric access link. Nothing is added to the root namespace: the addresses exist
only inside namespaces this process made, and a peer reaches the others only through the bridge.

Every namespace is named ``snb<pid>-<k>`` after the process that made it. :meth:`Links.close` (also
on leaving a ``with`` block, at exit, and on SIGTERM, SIGINT or SIGHUP) deletes them, which deletes
their veths and queues; a run killed with SIGKILL leaves its namespaces behind, and the next
:class:`Links` deletes those whose maker is gone. Needs root and ``ip``/``tc`` (iproute2);
:func:`unavailable` says why not where they are missing. No side effects at import.
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import subprocess
from pathlib import Path
from types import FrameType, TracebackType
from typing import Self

PREFIX = "snb"
SUBNET = "10.99.0"
# A bucket of 64 KiB passes a full TSO segment train at once without letting a burst exceed a few
# milliseconds of the rate; 50 ms of queue keeps TCP from losing packets to the shaper at 100 Mbit/s.
BURST = "64kb"
LATENCY = "50ms"


class LinkError(RuntimeError):
    """An ``ip`` or ``tc`` command failed while building the links."""


def _run(*cmd: str) -> str:
    done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise LinkError(f"{' '.join(cmd)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def unavailable() -> str | None:
    """Why namespaces cannot be made here (one sentence), or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root; running on loopback only"
    try:
        _run("ip", "netns", "list")
        _run("tc", "-V")
    except (OSError, LinkError) as e:
        return f"iproute2 is not usable ({e}); running on loopback only"
    return None


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: its maker was killed and only waits to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def sweep_stale(prefix: str = PREFIX) -> list[str]:
    """Delete the namespaces named ``<prefix><pid>-...`` of earlier runs whose process is gone (killed before
    it could clean up)."""
    gone = []
    pattern = re.compile(rf"^{prefix}(\d+)-\w+$")
    for line in _run("ip", "netns", "list").splitlines():
        name = line.split()[0] if line.strip() else ""
        match = pattern.match(name)
        if match and not pid_alive(int(match.group(1))):
            _run("ip", "netns", "delete", name)
            gone.append(name)
    return gone


class NamespaceOwner:
    """Namespaces named ``<prefix><pid>-<role>`` that go when this object closes: on ``close``, leaving a
    ``with`` block, at exit, and on SIGTERM, SIGINT or SIGHUP; those of earlier owners that were killed are
    swept when a new one starts."""

    name_prefix = PREFIX

    def __init__(self) -> None:
        self.made: list[str] = []
        self._previous: dict[int, object] = {}
        sweep_stale(self.name_prefix)
        atexit.register(self.close)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def _ns(self, role: str) -> str:
        return f"{self.name_prefix}{os.getpid()}-{role}"

    def _add_namespace(self, name: str) -> None:
        _run("ip", "netns", "add", name)
        self.made.append(name)
        _run("ip", "-n", name, "link", "set", "lo", "up")

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.close()
        previous = self._previous.get(signum)
        if callable(previous):
            previous(signum, frame)
        raise SystemExit(128 + signum)

    def _release(self) -> None:
        """What a subclass stops before its namespaces go (processes running inside them)."""

    def close(self) -> None:
        """Delete every namespace this object made (their veths, queues and rules go with them). Safe to call
        again."""
        self._release()
        while self.made:
            name = self.made.pop()
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=30, check=False)
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)  # type: ignore[arg-type]
        self._previous.clear()
        atexit.unregister(self.close)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Links(NamespaceOwner):
    """``peers`` namespaces, each linked to one bridge at ``rate_mbit`` each way (None: unshaped veths)."""

    def __init__(self, peers: int, rate_mbit: float | None) -> None:
        self.peers = peers
        self.rate_mbit = rate_mbit
        super().__init__()
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def namespace(self, i: int) -> str:
        return self._ns(f"p{i}")

    def host(self, i: int) -> str:
        """Peer i's address, reachable from every other peer's namespace."""
        return f"{SUBNET}.{i + 1}"

    def prefix(self, i: int) -> list[str]:
        """What to put before a command so that it runs inside peer i's namespace (``ip`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.namespace(i)]

    def _build(self) -> None:
        switch = self._ns("sw")
        self._add_namespace(switch)
        _run("ip", "-n", switch, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", switch, "link", "set", "br0", "up")
        for i in range(self.peers):
            ns, inner, outer = self.namespace(i), f"{PREFIX}{os.getpid()}p{i}", f"{PREFIX}{os.getpid()}s{i}"
            self._add_namespace(ns)
            _run("ip", "link", "add", inner, "netns", ns, "type", "veth", "peer", "name", outer, "netns", switch)
            _run("ip", "-n", switch, "link", "set", outer, "master", "br0")
            _run("ip", "-n", switch, "link", "set", outer, "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.host(i)}/24", "dev", inner)
            _run("ip", "-n", ns, "link", "set", inner, "up")
            if self.rate_mbit is not None:
                for where, dev in ((ns, inner), (switch, outer)):  # the peer's upload, then its download
                    rate = f"{self.rate_mbit:g}mbit"
                    _run("tc", "-n", where, "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
                         "burst", BURST, "latency", LATENCY)  # fmt: skip
