"""The sync's transport seam holds: only the hivemind adapter touches hivemind's networking.

Everything else in swarm/sync takes the protocols of swarm/sync/transport.py, which is what lets the
simulated network (tests/simnet.py) stand in for the daemons.
"""

from __future__ import annotations

import re
from pathlib import Path

import swarm.sync

ADAPTER = "hivemind_transport.py"
FORBIDDEN = re.compile(r"^\s*(from|import)\s+hivemind\b|\._client\b|\._p2p\b")


def seam_breaks(sources: dict[str, str]) -> dict[str, list[str]]:
    """Per module other than the adapter, the lines that reach hivemind or its daemon client."""
    out: dict[str, list[str]] = {}
    for name, text in sources.items():
        if name == ADAPTER:
            continue
        hits = [line.strip() for line in text.splitlines() if FORBIDDEN.search(line)]
        if hits:
            out[name] = hits
    return out


def _sources() -> dict[str, str]:
    root = Path(swarm.sync.__file__).parent
    return {p.name: p.read_text() for p in sorted(root.glob("*.py"))}


def test_only_the_adapter_reaches_hivemind() -> None:
    sources = _sources()
    assert ADAPTER in sources and seam_breaks({"x.py": sources[ADAPTER]})  # the adapter is where it all went
    assert seam_breaks(sources) == {}


def test_a_module_that_dials_the_daemon_itself_is_named() -> None:
    leaky = {"allreduce.py": "from hivemind.p2p import P2P\n\nclient = self._p2p._client\n"}
    assert seam_breaks(leaky) == {"allreduce.py": ["from hivemind.p2p import P2P", "client = self._p2p._client"]}
