"""Small commands: ``swarm-node init`` (write a config file) and ``swarm-node id`` (who am I)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from node.cli.configfile import render_default_config
from node.cli.errors import CliError
from node.cli.main import build_parser, parse_host_port
from node.observe.reach import listen_multiaddrs

logger = logging.getLogger(__name__)


def run_init(args: Any) -> int:
    """Write the commented default config to ``args.path``; an existing file needs ``--force``."""
    path = Path(args.path).expanduser()
    if path.exists() and not args.force:
        raise CliError(f"{path} already exists; pass --force to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_default_config(build_parser()))
    print(f"wrote {path}; edit it, then: swarm-node start --config {path}")
    return 0


def run_id(args: Any) -> int:
    """Print the peer id (creating the key file if needed) and, with a port, the listen multiaddrs."""
    from swarm.identity import IdentityError, load_or_create

    # the address first: a bad one must not leave a new key file behind
    host_port = parse_host_port(args.host_port, "0.0.0.0") if args.host_port is not None else None
    key = Path(args.identity).expanduser()
    existed = key.exists()
    try:
        identity = load_or_create(key)
    except IdentityError as e:
        raise CliError(str(e)) from None
    print(identity.peer_id)
    if not existed:
        print(f"(new identity written to {key})")
    if host_port is not None:
        host, port = host_port
        if port == 0:
            print("(port 0: the port is chosen at start, so the addresses are not known yet)")
            return 0
        print("would listen on:")
        for addr in listen_multiaddrs(host, port, identity.peer_id):
            print(f"  {addr}")
    return 0
