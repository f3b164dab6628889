from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from swarm.identity import IdentityError, load_or_create


def test_created_once_private_and_stable(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "id.key"
    a = load_or_create(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    b = load_or_create(path)
    assert a.peer_id == b.peer_id and a.peer_id.startswith("12D3KooW")
    assert not list(path.parent.glob(".*.tmp"))  # no temp file left behind


def test_foreign_or_corrupt_file_gives_a_fix(tmp_path: Path) -> None:
    path = tmp_path / "id.key"
    path.write_bytes(b"not a key")
    with pytest.raises(IdentityError, match="move it away"):
        load_or_create(path)
    good = load_or_create(tmp_path / "good.key")
    raw = bytearray(good.path.read_bytes())
    raw[-1] ^= 1  # public key no longer matches the seed
    path.write_bytes(bytes(raw))
    with pytest.raises(IdentityError, match="corrupt"):
        load_or_create(path)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_key_others_can_read_is_refused_with_the_fix(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "id.key"
    first = load_or_create(path)
    os.chmod(path, mode)
    with pytest.raises(IdentityError, match=f"chmod 600 {path}"):
        load_or_create(path)
    os.chmod(path, 0o400)  # read-only for the owner is private enough
    assert load_or_create(path).peer_id == first.peer_id
