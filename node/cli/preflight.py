"""Start-up checks that need no heavy import, run before torch and hivemind load.

A node command (``start``, ``join``, ``local``) spends seconds importing torch
and hivemind and starting its DHT before it reads its log folder, key file or
ports; a mistake found then costs that wait and leaves helpers to shut down.
Everything checkable with the standard library (and the key file's own
decoder) is checked here first: the log folder, the identity, the listen and
dashboard ports (each bind-tested), the peers' addresses and peer ids, the
model folder, the task names, and ``--resume`` against ``--rounds``. Each
problem is one sentence naming the fix, raised as a
:class:`~node.cli.errors.CliError`; :func:`start_warnings` names what is
accepted but does less than it seems.

The key file's and peer ids' decoders live in :mod:`protocol`, whose import (its message schemas and
``cryptography``) costs a fifth of a second: they are imported only where a key file exists or a peer
is given, so the other refusals stay at the interpreter's own start-up time.
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

from node.cli.errors import CliError
from node.core.checkpoint_round import read_round
from node.core.options import NodeOptions
from swarm.maddr import peer_address_problem

ED25519_ID_LENGTH = 52
"""Characters of an Ed25519 libp2p peer id (``12D3KooW`` + 44): what every swarm-node prints."""
ED25519_ID_PREFIX = "12D3KooW"


def parse_host_port(text: str | None, default_host: str) -> tuple[str, int]:
    """``PORT`` or ``HOST:PORT`` -> (host, port), with a one-sentence error."""
    if text is None:
        return default_host, 0
    host, _, port = text.rpartition(":")
    try:
        value = int(port)
    except ValueError:
        raise CliError(f"--host-port {text!r} is not PORT or HOST:PORT, e.g. --host-port 31337") from None
    if not 0 <= value <= 65535:
        raise CliError(f"--host-port {text!r}: the port must be 0-65535 (0 picks a free one)")
    return host or default_host, value


def log_dir_problem(text: str, flag: str = "--log-dir") -> str | None:
    """Why the folder ``text`` cannot hold a node's files (one sentence), or None; creates nothing."""
    path = Path(text).expanduser()
    existing = nearest_existing(path)
    if not existing.is_dir():
        shown = "" if existing == path else f" ({existing} is a file)"
        return f"{flag} {text} names a file{shown}; pass a folder (it is created if missing)"
    if reason := unwritable(existing):
        return f"{flag} {text}: cannot write in {existing} ({reason}); pass a folder you can write to"
    return None


def nearest_existing(path: Path) -> Path:
    """``path`` itself if it exists, else its nearest existing ancestor (where creating it starts)."""
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def unwritable(folder: Path) -> str | None:
    """Why nothing can be created in ``folder`` (its error), or None: probed by making and removing a
    folder there, since a permission check alone says yes to root even where the file system refuses."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".swarm-node-probe-", dir=folder))
    except OSError as e:
        return e.strerror or str(e)
    return None


def identity_peer_id(text: str) -> str | None:
    """The peer id of the key file ``text`` (None if it does not exist yet: the node creates it).

    Raises :class:`CliError` naming the fix for a folder, an unreadable, corrupt or shared key file,
    or a path whose folder cannot be created.
    """
    path = Path(text).expanduser()
    if path.is_dir():
        raise CliError(f"--identity {text} is a directory; pass a key file path, e.g. {path / 'identity.key'}")
    if not path.exists():
        existing = nearest_existing(path)
        reason = f"{existing} is a file" if not existing.is_dir() else unwritable(existing)
        if reason:
            raise CliError(f"--identity {text} cannot be created ({reason}); pass a key file path you can write")
        return None
    from protocol.peer_id import peer_id_from_public_key
    from swarm.identity import IdentityError, check_private, decode_key_file

    try:
        data = path.read_bytes()
    except OSError as e:
        raise CliError(
            f"--identity {text} cannot be read ({e.strerror}); fix its permissions or pass another"
        ) from None
    try:
        key = decode_key_file(data, path)
        check_private(path)
    except IdentityError as e:
        raise CliError(str(e)) from None
    return peer_id_from_public_key(key.public_key)


def bind_problem(host: str, port: int, flag: str, given: str) -> str | None:
    """Why ``host:port`` cannot be listened on now (one sentence naming ``flag``), or None.

    The probe sets ``SO_REUSEADDR`` as servers do, so a port that only lingers in TIME_WAIT after a
    previous run passes, while one another program listens on is refused.
    """
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)[0]
    except (OSError, UnicodeError):
        return f"{flag} {given}: {host} is not an address of this machine; use 0.0.0.0 (all) or 127.0.0.1"
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            return _bind_error(e, host, port, flag, given)
    return None


def _bind_error(e: OSError, host: str, port: int, flag: str, given: str) -> str:
    if e.errno == errno.EADDRINUSE:
        return f"{flag} {given}: port {port} is in use by another program; pick another port, or 0 for any free one"
    if e.errno == errno.EADDRNOTAVAIL:
        return f"{flag} {given}: {host} is not an address of this machine; use 0.0.0.0 (all) or 127.0.0.1"
    if e.errno == errno.EACCES:
        return f"{flag} {given}: port {port} needs administrator rights; pick a port above 1023, or 0"
    return f"{flag} {given}: cannot listen on {host}:{port} ({e.strerror}); pick another address or port"


def peer_id_problem(address: str) -> str | None:
    """Why the ``/p2p/<id>`` part of ``address`` is no peer id (one sentence), or None.

    A libp2p peer id is a base58 multihash: the identity hash of an Ed25519 key (what every
    swarm-node has) or the sha256 of a longer key; a copied address cut short decodes to neither.
    """
    parts = address.split("/")
    ids = [parts[i + 1] for i, name in enumerate(parts[:-1]) if name in ("p2p", "ipfs")]
    for peer_id in ids:
        if peer_id.startswith("bafz"):  # a CIDv1 peer id (base32): hivemind's own parser judges it
            continue
        if not _is_multihash(peer_id):
            cut = peer_id.startswith(ED25519_ID_PREFIX) and len(peer_id) < ED25519_ID_LENGTH
            what = f"is truncated ({len(peer_id)} of {ED25519_ID_LENGTH} characters)" if cut else "is not a peer id"
            return f"--peer {address}: {peer_id!r} {what}; copy the whole address the other node printed"
    return None


def _is_multihash(text: str) -> bool:
    from protocol.errors import MessageRejected
    from protocol.peer_id import b58decode

    try:
        raw = b58decode(text)
    except MessageRejected:
        return False
    identity = len(raw) >= 2 and raw[0] == 0x00 and raw[1] == len(raw) - 2
    sha256 = len(raw) == 34 and raw[0] == 0x12 and raw[1] == 0x20
    return identity or sha256


def model_folder_problem(name: str, flag: str) -> str | None:
    """A ``--model`` folder that is no Hugging Face model folder (no config.json), in one sentence; else None."""
    if os.path.isdir(name) and not os.path.isfile(os.path.join(name, "config.json")):
        return (
            f"{flag} {name}: {os.path.abspath(name)} has no config.json, so it is no Hugging Face model folder; "
            "give the folder save_pretrained wrote, or a built-in model name"
        )
    return None


def task_problem(args: argparse.Namespace) -> str | None:
    """The first ``--task`` or ``--accept-task`` that names no task family, in one sentence; else None."""
    given = [("--task", t) for t in args.tasks or ()] + [("--accept-task", t) for t in args.accept_tasks or ()]
    if not given:
        return None
    from node.tasks.registry import task_names  # the registry's names: no model library behind them

    known = task_names()
    for flag, name in given:
        if name not in known:
            return f"{flag} {name}: unknown task family; use one of {', '.join(known)}"
    return None


def resume_problem(log_dir: str, peer_id: str, rounds: int) -> str | None:
    """With ``--resume``, a checkpoint already at or past ``--rounds`` (the node would exit at once); else None."""
    if rounds <= 0:
        return None
    directory = Path(log_dir).expanduser() / peer_id[-6:]  # protocol.short_id: the node's own folder
    done = read_round(directory)
    if done is None or done < rounds:
        return None
    return (
        f"--resume: the checkpoint in {directory} is at round {done}, and --rounds {rounds} counts from the "
        f"first round, so nothing is left to run; raise --rounds above {done} (0 runs until stopped)"
    )


def preflight(args: argparse.Namespace) -> None:
    """Every start-up check of node command ``args.command`` that needs no heavy import; the first problem
    raises :class:`CliError` (the checks after it do not run)."""
    for problem in _problems(args):
        if problem:
            raise CliError(problem)


def _problems(args: argparse.Namespace) -> Iterator[str | None]:
    """The checks in the order a user meets them, each run when the one before it has passed."""
    for address in getattr(args, "peer", None) or ():
        yield peer_address_problem(address) or peer_id_problem(address)
    for flag, name in _models(args):
        yield model_folder_problem(name, flag)
    yield task_problem(args)
    yield log_dir_problem(args.log_dir)
    if args.command == "local":  # its nodes get their own ports; a busy dashboard port falls back to a free one
        for key in _local_key_files(args):  # a key kept from an earlier run is reused
            if key.exists():
                identity_peer_id(str(key))
        return
    peer_id = identity_peer_id(args.identity)
    host, port = parse_host_port(args.host_port, "0.0.0.0")
    if port:
        yield bind_problem(host, port, "--host-port", args.host_port)
    if args.dashboard_port:
        yield bind_problem(args.dashboard_host, args.dashboard_port, "--dashboard-port", str(args.dashboard_port))
    if args.resume and peer_id is not None and not args.hold:  # a held node serves its rollouts: not idle
        yield resume_problem(args.log_dir, peer_id, args.rounds)


def _models(args: argparse.Namespace) -> list[tuple[str, str]]:
    models = [("--model", str(getattr(args, "model", "") or ""))]
    listed = getattr(args, "models", None) or ""
    models += [("--models", m.strip()) for m in str(listed).split(",")]
    return [(flag, name) for flag, name in models if name]


def _local_key_files(args: argparse.Namespace) -> list[Path]:
    return [Path(args.log_dir).expanduser() / "keys" / f"node{i}.key" for i in range(args.nodes)]


def _local_all_done(args: argparse.Namespace) -> str | None:
    """``local --resume`` where every node's checkpoint is at ``--rounds`` already: nothing is trained.

    A warning, not a refusal: a node that finished holds (serves its rollouts) while slower ones catch
    up, and an experiment resumes a run whose nodes all finished to write its summary.
    """
    rounds = []
    for key in _local_key_files(args):
        peer_id = identity_peer_id(str(key)) if key.exists() else None
        done = read_round(Path(args.log_dir).expanduser() / peer_id[-6:]) if peer_id else None
        if done is None or done < args.rounds:
            return None
        rounds.append(done)
    return (
        f"--resume: every node's checkpoint in {args.log_dir} is at round {min(rounds)} or later, and --rounds "
        f"{args.rounds} counts from the first round, so no node trains; raise --rounds above {max(rounds)}"
    )


def start_warnings(args: argparse.Namespace | NodeOptions) -> list[str]:
    """What a node command should hear before it starts: options that are accepted but do less than
    they seem to. Each is one sentence naming the fix."""
    out = []
    if args.sync_every > 0 and args.sync_period_s > 0:
        # a sweep passes both on purpose (its sync_every marks a synced run), so this is no refusal
        out.append(
            f"--sync-period {args.sync_period_s:g} decides when to sync (on a clock shared by all peers), so "
            f"--sync-every {args.sync_every} only turns the sync on; drop --sync-every to count on the clock alone"
        )
    if not args.adaptive_share and args.share_threshold != 1.0:
        out.append(
            f"--share-threshold {args.share_threshold:g} sets the adaptive share, which --no-adaptive-share turns "
            "off; drop one of the two"
        )
    if args.sample_precision == "bfloat16" and args.device not in ("cpu", "auto"):
        out.append(
            f"--sample-precision bfloat16 makes a bf16 copy for sampling on a CPU only; on {args.device} the "
            "forward passes already run in bf16 where the device supports it, so drop --sample-precision"
        )
    if isinstance(args, argparse.Namespace) and args.command == "local" and args.resume:
        out += [w for w in [_local_all_done(args)] if w]
    return out
