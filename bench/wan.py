"""A WAN testbed in network namespaces: public hosts, homes behind NAT routers, slow and lossy links.

Volunteers are not on loopback: most sit behind a home router that rewrites their address
(masquerade) and accepts no connection it did not see go out, far from each other, on links that
delay and drop. :class:`Wan` builds that, on one machine, out of namespaces it owns:

- an *internet*: a bridge in its own namespace, subnet ``203.0.114.0/24``. The prefix is globally
  routable on purpose: libp2p (AutoNAT, relays, address filtering) and the node's reachability advice
  treat the documentation and benchmarking ranges as private, so a testbed on them has no public peer.
  Nothing leaves the namespaces, so no real host with those addresses is ever reached.
- *public hosts* ``203.0.114.(10+i)``, each on its own access link to the internet;
- *homes*: a router namespace on an access link (``203.0.114.(100+k)``) with a LAN bridge
  ``10.20.k.1/24`` behind it, masquerade on its internet side and nothing forwarded in (nftables),
  and the home's peers ``10.20.k.(10+j)`` on the LAN. Optionally the router forgets an idle TCP mapping
  after ``nat_idle_s`` (conntrack's established timeout: home routers keep minutes, not days).
- with a :class:`~bench.linkemu.LinkShape`, every access link runs through the user-space emulator
  (:mod:`bench.linkemu`) in a *wire* namespace, so a path between two hosts crosses two shaped links:
  a round trip is four one-way delays. ``rate_mbit`` adds a token bucket at each end of each access link.

Every namespace is named ``snw<pid>-<role>``; :meth:`Wan.close` (also on leaving a ``with`` block, at
exit, and on SIGTERM/SIGINT/SIGHUP) stops the emulator and deletes them, which deletes every veth,
queue, route and nftables rule with them; the emulator dies with its maker (``PR_SET_PDEATHSIG``), and
a later :class:`Wan` deletes the namespaces of makers that were SIGKILLed. Needs root, iproute2,
nftables and ethtool (``make wan-deps`` installs the last two from Debian's packages);
:func:`unavailable` says in one sentence what is missing. No side effects at import.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.linkemu import LinkShape, LinkSpec, dump_specs
from bench.links import LinkError, NamespaceOwner, pid_alive
from bench.links import _run as run
from bench.links import unavailable as links_unavailable

PREFIX = "snw"


def sweep_stale_dirs(root: Path | None = None) -> list[Path]:
    """Delete the scratch folders ``<tmp>/<PREFIX><pid>-...`` (link specs, router rules) of testbeds whose
    maker is gone: a SIGKILLed testbed removes nothing itself."""
    gone = []
    for path in Path(root or tempfile.gettempdir()).glob(f"{PREFIX}*-*"):
        pid = path.name[len(PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and path.is_dir() and not pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            gone.append(path)
    return gone


INTERNET = "203.0.114"
BURST = "64kb"
TBF_LATENCY = "100ms"
OFFLOADS = ("rx", "tx", "tso", "gso", "gro")  # off on both ends of an emulated link: real frames, real checksums
PR_SET_PDEATHSIG = 1
EMULATOR = Path(__file__).resolve().parent / "linkemu.py"


@dataclass(frozen=True)
class Host:
    """A machine of the testbed: where it runs, the address it has there, and the home it sits in."""

    name: str
    namespace: str
    ip: str
    home: int | None  # None: a public host

    @property
    def public(self) -> bool:
        return self.home is None


def unavailable() -> str | None:
    """Why the testbed cannot be built here (one sentence naming the fix), or None when it can."""
    why = links_unavailable()
    if why is not None:
        return why
    for tool, package in (("nft", "nftables"), ("ethtool", "ethtool")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed; run `make wan-deps` (Debian package {package})"
    return None


def _die_with_parent() -> None:
    """In the emulator's child: receive SIGKILL when the testbed's process dies, however it dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class Wan(NamespaceOwner):
    """Public hosts and NATed homes on one emulated internet; see the module's docstring."""

    name_prefix = PREFIX

    def __init__(
        self,
        public: int,
        homes: list[int],
        shape: LinkShape | None = None,
        rate_mbit: float | None = None,
        nat_idle_s: int | None = None,
        seed: int = 0,
    ) -> None:
        if public < 0 or any(n < 1 for n in homes) or public + len(homes) == 0:
            raise ValueError("a testbed needs at least one host, and every home at least one peer")
        self.shape, self.rate_mbit, self.nat_idle_s, self.seed = shape, rate_mbit, nat_idle_s, seed
        self.hosts: list[Host] = []
        self.routers: list[str] = []
        self._links: list[LinkSpec] = []
        self._emulator: subprocess.Popen[bytes] | None = None
        sweep_stale_dirs()
        self._dir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
        super().__init__()
        try:
            self._build(public, homes)
        except BaseException:
            self.close()
            raise

    # --- naming ---------------------------------------------------------------------------------

    def _dev(self, tag: str) -> str:
        name = f"w{os.getpid() % 100000}{tag}"
        if len(name) > 15:
            raise LinkError(f"interface name {name} is over 15 characters")
        return name

    def prefix(self, host: Host) -> list[str]:
        """What to put before a command so that it runs on ``host`` (``ip netns exec``: same pid)."""
        return ["ip", "netns", "exec", host.namespace]

    def router(self, home: int) -> str:
        """The namespace of home ``home``'s router (its public address is :meth:`router_ip`)."""
        return self.routers[home]

    def router_ip(self, home: int) -> str:
        return f"{INTERNET}.{100 + home}"

    @property
    def internet(self) -> str:
        return self._ns("inet")

    # --- building -------------------------------------------------------------------------------

    def _veth(self, ns_a: str, dev_a: str, ns_b: str, dev_b: str) -> None:
        run("ip", "link", "add", dev_a, "netns", ns_a, "type", "veth", "peer", "name", dev_b, "netns", ns_b)
        run("ip", "-n", ns_a, "link", "set", dev_a, "up")
        run("ip", "-n", ns_b, "link", "set", dev_b, "up")

    def _offloads_off(self, ns: str, dev: str) -> None:
        cmd = ["ip", "netns", "exec", ns, "ethtool", "-K", dev]
        for feature in OFFLOADS:
            cmd += [feature, "off"]
        run(*cmd)

    def _shape_rate(self, ns: str, dev: str) -> None:
        if self.rate_mbit is not None:
            run("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{self.rate_mbit:g}mbit",
                "burst", BURST, "latency", TBF_LATENCY)  # fmt: skip

    def _access_link(self, ns: str, tag: str, ip: str) -> str:
        """Connect ``ns`` to the internet at ``ip`` (through the emulator when shaped); returns its device."""
        dev, port = self._dev(f"{tag}h"), self._dev(f"{tag}i")
        if self.shape is None:
            self._veth(ns, dev, self.internet, port)
        else:
            wire_a, wire_b = self._dev(f"{tag}a"), self._dev(f"{tag}b")
            self._veth(ns, dev, self._ns("wire"), wire_a)
            self._veth(self._ns("wire"), wire_b, self.internet, port)
            for where, d in ((ns, dev), (self._ns("wire"), wire_a), (self._ns("wire"), wire_b), (self.internet, port)):
                self._offloads_off(where, d)
            for d in (wire_a, wire_b):
                run("ip", "-n", self._ns("wire"), "link", "set", d, "promisc", "on")
            self._links.append(LinkSpec(tag, wire_a, wire_b, self.shape, self.shape))
        run("ip", "-n", self.internet, "link", "set", port, "master", "br0")
        run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
        self._shape_rate(ns, dev)  # the host's upload
        self._shape_rate(self.internet, port)  # its download
        return dev

    def _build(self, public: int, homes: list[int]) -> None:
        self._add_namespace(self.internet)
        run("ip", "-n", self.internet, "link", "add", "br0", "type", "bridge")
        run("ip", "-n", self.internet, "link", "set", "br0", "up")
        if self.shape is not None:
            self._add_namespace(self._ns("wire"))
        for i in range(public):
            host = Host(f"pub{i}", self._ns(f"pub{i}"), f"{INTERNET}.{10 + i}", None)
            self._add_namespace(host.namespace)
            self._access_link(host.namespace, f"p{i}", host.ip)
            self.hosts.append(host)
        for k, peers in enumerate(homes):
            self._build_home(k, peers)
        if self._links:
            self._start_emulator()

    def _build_home(self, k: int, peers: int) -> None:
        rt = self._ns(f"rt{k}")
        self._add_namespace(rt)
        self.routers.append(rt)
        wan = self._access_link(rt, f"r{k}", self.router_ip(k))
        run("ip", "-n", rt, "link", "add", "lan", "type", "bridge")
        run("ip", "-n", rt, "addr", "add", f"10.20.{k}.1/24", "dev", "lan")
        run("ip", "-n", rt, "link", "set", "lan", "up")
        run("ip", "netns", "exec", rt, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        rules = (
            "table ip home {\n"
            "  chain forward { type filter hook forward priority 0; policy drop;\n"
            '    iifname "lan" accept\n'
            "    ct state established,related accept\n"
            "  }\n"
            "  chain post { type nat hook postrouting priority 100;\n"
            f'    oifname "{wan}" masquerade\n'
            "  }\n"
            "}\n"
        )
        rules_file = self._dir / f"rt{k}.nft"
        rules_file.write_text(rules)
        run("ip", "netns", "exec", rt, "nft", "-f", str(rules_file))
        if self.nat_idle_s is not None:
            key = "net.netfilter.nf_conntrack_tcp_timeout_established"
            run("ip", "netns", "exec", rt, "sysctl", "-q", "-w", f"{key}={self.nat_idle_s}")
        for j in range(peers):
            host = Host(f"home{k}-{j}", self._ns(f"h{k}p{j}"), f"10.20.{k}.{10 + j}", k)
            self._add_namespace(host.namespace)
            dev, port = self._dev(f"{k}l{j}"), self._dev(f"{k}m{j}")
            self._veth(host.namespace, dev, rt, port)
            run("ip", "-n", rt, "link", "set", port, "master", "lan")
            run("ip", "-n", host.namespace, "addr", "add", f"{host.ip}/24", "dev", dev)
            run("ip", "-n", host.namespace, "route", "add", "default", "via", f"10.20.{k}.1")
            self.hosts.append(host)

    def _start_emulator(self) -> None:
        spec = self._dir / "links.json"
        dump_specs(self._links, spec)
        cmd = ["ip", "netns", "exec", self._ns("wire"), sys.executable, str(EMULATOR), "--spec", str(spec)]
        cmd += ["--stats", str(self.stats_path), "--seed", str(self.seed)]
        self._emulator = subprocess.Popen(cmd, preexec_fn=_die_with_parent, stdin=subprocess.DEVNULL)

    @property
    def stats_path(self) -> Path:
        """The emulator's counters (frames passed, dropped), rewritten every second."""
        return self._dir / "emulator.json"

    # --- faults ---------------------------------------------------------------------------------

    def cut_home(self, home: int, cut: bool = True) -> None:
        """Take home ``home``'s access link down (``cut=False``: bring it back): the home is an island."""
        run("ip", "-n", self.router(home), "link", "set", self._dev(f"r{home}h"), "down" if cut else "up")

    # --- cleaning up ----------------------------------------------------------------------------

    def _release(self) -> None:
        """Stop the emulator before the namespaces go (it runs inside one)."""
        if self._emulator is not None:
            self._emulator.terminate()
            try:
                self._emulator.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._emulator.kill()
                self._emulator.wait(timeout=5)
            self._emulator = None
        shutil.rmtree(self._dir, ignore_errors=True)
