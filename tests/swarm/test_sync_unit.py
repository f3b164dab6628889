"""Outer sync without a network: pure decisions, compression, the outer step, config, records."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import Any, cast

import numpy as np
import pytest
import torch

from protocol import SigningKey
from protocol.errors import MessageRejected
from protocol.signing import seal
from swarm.configs import MAX_WINDOW_FACTOR
from swarm.fingerprint import model_fingerprint, sync_fingerprint
from swarm.memo import ContentMemo
from swarm.sync import (
    AbortCause,
    OuterSyncConfig,
    SyncOutcome,
    SyncReport,
    decide_catch_up,
    decide_commit,
    decide_group,
    tensors,
)
from swarm.sync import records as records_module
from swarm.sync.config import BYTES_PER_ELEMENT, COMPRESSIONS
from swarm.sync.decide import (
    earliest_open_window,
    expected_members,
    group_id,
    live_records,
    missing_votes,
    running_window,
    should_close,
    window_for,
    window_length,
    window_sealed,
)
from swarm.sync.errors import BadBytes
from swarm.sync.hivemind_transport import MembershipLoop
from swarm.sync.outer import fit_momentum
from swarm.sync.records import (
    JOIN_KIND,
    MAX_RECORD_BYTES,
    MAX_SKIP,
    STATE_KIND,
    VOTE_KIND,
    JoinRecord,
    StateRecord,
    VoteRecord,
    open_records,
    seal_record,
)
from swarm.sync.tensors import (
    INT8_CHUNK,
    decode,
    encode,
    encoded_size,
    outer_step,
    reduce_parts,
    slice_bounds,
    state_hash,
)

FP, H0, H1 = "0123456789abcdef", "a" * 64, "b" * 64
CFG = OuterSyncConfig(matchmaking_timeout_s=4.0, min_group_size=2, max_group_size=3)
ALL = frozenset("abcde")  # every peer of these tests is trusted (trust itself: tests/swarm/test_sync_catchup.py)


def _join(peer: str, window: float, revision: int = 0) -> JoinRecord:
    return JoinRecord(peer, FP, revision, H0, window, window)


def _state(peer: str, revision: int, h: str, created: float = 1.0) -> StateRecord:
    return StateRecord(peer, FP, revision, h, created)


# ---- matchmaking -------------------------------------------------------------------------------


def test_earliest_open_window_ignores_closed_and_future_windows() -> None:
    recs = {"a": _join("a", 10.0), "b": _join("b", 11.0), "c": _join("c", 30.0)}
    assert earliest_open_window(recs, now=12.0, window_s=4.0) == 10.0
    assert earliest_open_window(recs, now=13.5, window_s=4.0) == 11.0  # 10 + 3 closed to joiners
    assert earliest_open_window(recs, now=20.0, window_s=4.0) is None


def test_decide_group_gathers_until_the_window_closes() -> None:
    recs = {"a": _join("a", 10.0), "b": _join("b", 10.0)}
    assert decide_group(recs, 13.9, CFG, "a").status == "gather"
    assert decide_group(recs, 14.0, CFG, "a").status == "ready"


def _asking(peer: str, window: float, window_s: float) -> JoinRecord:
    return JoinRecord(peer, FP, 0, H0, window, window, window_s=window_s)


def test_a_window_lasts_what_its_opener_asked_within_the_clamp() -> None:
    # opened by a peer whose syncs run slow (window_for): 9 s, not the configured 4
    recs = {"a": _asking("a", 10.0, 9.0), "b": _asking("b", 10.0, 9.0)}
    assert decide_group(recs, 18.9, CFG, "a").status == "gather"
    ready = decide_group(recs, 19.0, CFG, "b")
    assert (ready.status, ready.window_s) == ("ready", 9.0)
    assert earliest_open_window(recs, now=16.7, window_s=4.0) == 10.0  # joiners until 10 + 0.75 x 9
    assert earliest_open_window(recs, now=16.8, window_s=4.0) is None
    # a stranger asking for 100 s holds its members at most MAX_WINDOW_FACTOR x the configured window
    greedy = {"a": _asking("a", 10.0, 100.0), "b": _asking("b", 10.0, 100.0)}
    assert decide_group(greedy, 10.0 + MAX_WINDOW_FACTOR * 4.0, CFG, "a").status == "ready"
    # one record asking for less brings the configured window back, for every member alike
    recs["c"] = _asking("c", 10.0, 0.0)
    assert window_length(recs, 10.0, 4.0) == 4.0 and decide_group(recs, 14.0, CFG, "a").status == "ready"


def test_a_member_yields_to_a_group_under_way_from_its_state_only_if_a_partner_is_in_it() -> None:
    under_way = {p: _join(p, 10.0) for p in "ab"}  # closed to joiners from 13.0 (4 s window)
    assert running_window(under_way, 13.0, 4.0, "c", {"a"}, 2) == 10.0
    assert running_window(under_way, 12.9, 4.0, "c", {"a"}, 2) is None  # still open: join it instead
    assert running_window(under_way, 18.0, 4.0, "c", {"a"}, 2) is None  # twice its length: it failed
    assert running_window(under_way, 13.0, 4.0, "a", {"b"}, 2) is None  # its own (aborted) window
    assert running_window(under_way, 13.0, 4.0, "c", {"a"}, 3) is None  # too few to be a group
    # minted keys' windows, however many, hold nobody back: none of them is a partner
    minted = {f"k{i}": _join(f"k{i}", 10.0) for i in range(50)}
    assert running_window(minted, 13.0, 4.0, "c", {"a"}, 2) is None


def test_the_window_a_peer_opens_follows_its_recent_allreduces() -> None:
    assert window_for(4.0, []) == 4.0
    assert window_for(4.0, [0.45] * 8) == 4.0  # loopback: the configured window
    assert window_for(4.0, [1.5, 1.6, 1.7]) == 4.8  # 3 x the median
    assert window_for(4.0, [5.5] * 5 + [0.1] * 3) == 12.0  # 100 ms round trips: clamped to 3 x 4
    assert window_for(5.0, [2.0, 60.0, 2.2]) == 6.6  # the median: one stall moves nothing


def test_every_member_computes_the_same_group() -> None:
    recs = {p: _join(p, 10.0) for p in ("c", "a", "b")}
    recs["old"] = _join("old", 2.0)  # an earlier (aborted) attempt's window
    decisions = [decide_group(recs, 14.5, CFG, me) for me in "abc"]
    assert {d.group_id for d in decisions} == {decisions[0].group_id}
    assert decisions[0].members == ("a", "b", "c")
    assert decisions[0].group_id == group_id(FP, 0, H0, 10.0, ("a", "b", "c"))


def test_decide_group_no_partner_and_full_group() -> None:
    assert decide_group({"a": _join("a", 10.0)}, 15.0, CFG, "a").status == "no partner"
    assert decide_group({}, 15.0, CFG, "a").status == "no partner"
    recs = {p: _join(p, 10.0) for p in "abcd"}
    assert decide_group(recs, 15.0, CFG, "a").members == ("a", "b", "c")
    assert decide_group(recs, 15.0, CFG, "d").status == "not in group"


def test_different_member_views_give_different_group_ids() -> None:
    full = {p: _join(p, 10.0) for p in "abc"}
    partial = {p: _join(p, 10.0) for p in "ab"}
    assert decide_group(full, 15.0, CFG, "a").group_id != decide_group(partial, 15.0, CFG, "a").group_id


def test_ghosts_with_low_ids_neither_join_nor_fill_the_group() -> None:
    """Keys 0, 1, 2 sort first and would take the whole max_group_size of 3; they never answered a ping."""
    recs = {p: _join(p, 10.0) for p in ("0", "1", "2", "a", "b", "c")}
    assert decide_group(recs, 15.0, CFG, "a").status == "not in group"
    views = [decide_group(live_records(recs, set("abc") - {me}, me), 15.0, CFG, me) for me in "abc"]
    assert all(v.status == "ready" and v.members == ("a", "b", "c") for v in views)
    assert len({v.group_id for v in views}) == 1  # every honest member pinged the same records


def test_live_records_keeps_own_record_and_the_answered_only() -> None:
    recs = {p: _join(p, 10.0) for p in "abg"}
    assert set(live_records(recs, set(), "a")) == {"a"}
    assert set(live_records(recs, {"b", "x"}, "a")) == {"a", "b"}
    assert decide_group(live_records(recs, set(), "a"), 15.0, CFG, "a").status == "no partner"


def test_missing_votes_names_the_other_silent_members_in_order() -> None:
    assert missing_votes({}, ["a", "b", "c"], "b") == ("a", "c")
    assert missing_votes({"a": "x", "c": "abort", "z": "x"}, ["a", "b", "c"], "b") == ()


# ---- commit vote -------------------------------------------------------------------------------

D = "d" * 64


@pytest.mark.parametrize(
    ("votes", "now", "expected"),
    [
        ({"a": D, "b": D}, 1.0, (True, "committed")),
        ({"a": D}, 1.0, (None, "pending")),
        ({"a": D}, 2.5, (False, "commit timeout")),
        ({"a": D, "b": "e" * 64}, 1.0, (False, "digest mismatch")),
        ({"a": D, "b": "abort"}, 1.0, (False, "aborted by a member")),
        ({"a": D, "b": D, "x": "e" * 64}, 1.0, (True, "committed")),  # non-members are ignored
        ({"a": D, "b": D}, 2.01, (False, "commit timeout")),  # seen only by a read begun too late
    ],
)
def test_decide_commit(votes: dict[str, str], now: float, expected: tuple[bool | None, str]) -> None:
    assert tuple(decide_commit(votes, ["a", "b"], now, deadline=2.0))[:2] == expected


# ---- catch-up ----------------------------------------------------------------------------------


def test_up_to_date_or_ahead_needs_no_catch_up() -> None:
    assert decide_catch_up({"b": _state("b", 3, H0)}, 3, H0, "a", ALL).target is None
    assert decide_catch_up({"b": _state("b", 2, H1)}, 3, H0, "a", ALL).target is None
    assert decide_catch_up({}, 0, H0, "a", ALL).target is None


def test_behind_catches_up_to_the_newest_majority() -> None:
    states = {
        "b": _state("b", 5, H1, created=1.0),
        "c": _state("c", 5, H1, created=3.0),
        "d": _state("d", 5, H0),
        "e": _state("e", 4, H0),
    }
    target = decide_catch_up(states, 2, H0, "a", ALL).target
    assert target is not None
    assert (target.revision, target.state_hash, target.donors) == (5, H1, ("c", "b"))


def test_diverged_peer_at_the_same_revision_catches_up_and_ties_break_by_hash() -> None:
    target = decide_catch_up({"b": _state("b", 3, H1), "c": _state("c", 3, H1)}, 3, H0, "a", ALL).target
    assert target is not None and target.state_hash == H1
    # one against one: the smaller hash wins, so exactly one of the two moves
    assert decide_catch_up({"b": _state("b", 3, H1)}, 3, H0, "a", ALL).target is None
    tie = decide_catch_up({"a": _state("a", 3, H0)}, 3, H1, "b", ALL).target
    assert tie is not None and tie.state_hash == H0 and tie.donors == ("a",)


def test_own_stale_record_is_not_a_donor() -> None:
    target = decide_catch_up({"a": _state("a", 9, H1), "b": _state("b", 4, H1)}, 2, H0, "a", ALL).target
    assert target is not None and target.revision == 4 and target.donors == ("b",)


# ---- tensors -----------------------------------------------------------------------------------


def test_slice_bounds_cover_everything() -> None:
    for n, k in [(10, 3), (5, 5), (3, 4), (1_000_003, 7)]:
        bounds = slice_bounds(n, k)
        assert bounds[0][0] == 0 and bounds[-1][1] == n and len(bounds) == k
        assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))


@pytest.mark.parametrize("compression", ["none", "fp16", "int8"])
def test_compression_round_trip(compression: str) -> None:
    x = torch.randn(3 * INT8_CHUNK + 17, generator=torch.Generator().manual_seed(0))
    data = encode(x, compression)
    assert len(data) == encoded_size(x.numel(), compression)
    y = decode(data, x.numel(), compression)
    assert y.dtype == torch.float32 and y.shape == x.shape
    if compression == "none":
        assert torch.equal(x, y)
    elif compression == "fp16":
        assert torch.allclose(x, y, rtol=1e-3, atol=1e-4)
    else:
        scale = x[:INT8_CHUNK].abs().max() / 127
        assert (x[:INT8_CHUNK] - y[:INT8_CHUNK]).abs().max() <= scale / 2 + 1e-7
    assert decode(data, x.numel(), compression).numpy().tobytes() == y.numpy().tobytes()  # deterministic


def _reference_encoding(x: np.ndarray, compression: str) -> bytes:
    """The wire format written plainly in numpy (explicit little-endian dtypes)."""
    if compression == "fp16":
        return bytes(np.clip(x, -65504.0, 65504.0).astype("<f2").tobytes())
    padded = np.zeros(-(-x.size // INT8_CHUNK) * INT8_CHUNK, dtype=np.float32)
    padded[: x.size] = x
    chunks = padded.reshape(-1, INT8_CHUNK)
    scales = np.abs(chunks).max(axis=1) / np.float32(127.0)
    scales = np.where(scales > 0, scales, np.float32(1.0)).astype(np.float32)
    q = np.clip(np.rint(chunks / scales[:, None]), -127, 127).astype(np.int8).reshape(-1)[: x.size]
    return bytes(scales.astype("<f4").tobytes() + q.tobytes())


@pytest.mark.parametrize("compression", ["fp16", "int8"])
@pytest.mark.parametrize("n", [1, INT8_CHUNK, 3 * INT8_CHUNK + 17])
def test_fast_encodings_write_the_reference_bytes(compression: str, n: int) -> None:
    """The in-place / torch-copy encoders give exactly the plain numpy encoding (a 1e6 value included:
    clamped under fp16), so peers on either code path send the same bytes."""
    x = 3 * torch.randn(n, generator=torch.Generator().manual_seed(n))
    x[0] = 1e6
    assert encode(x, compression) == _reference_encoding(x.numpy(), compression)


@pytest.mark.parametrize("compression", ["none", "fp16", "int8"])
def test_bad_bytes_are_refused(compression: str) -> None:
    data = encode(torch.ones(100), compression)
    with pytest.raises(BadBytes):
        decode(data[:-1], 100, compression)
    with pytest.raises(BadBytes):
        encode(torch.tensor([1.0, math.nan]), compression)
    if compression != "int8":
        inf = encode(torch.tensor([1.0]), "none").replace(b"\x00\x00\x80\x3f", b"\x00\x00\x80\x7f")
        with pytest.raises(BadBytes):
            decode(inf, 1, "none")


def test_trimmed_mean_resists_an_outlier() -> None:
    parts = [torch.full((4,), v) for v in (1.0, 1.1, 0.9, 1.0, 1000.0)]
    assert reduce_parts(parts, 4, "mean", 0.2)[0] > 100
    assert reduce_parts(parts, 4, "trimmed_mean", 0.2)[0] == pytest.approx(1.0333, abs=1e-3)
    assert torch.equal(reduce_parts([], 3, "mean", 0.2), torch.zeros(3))


@pytest.mark.parametrize("nesterov", [True, False])
def test_outer_step_matches_torch_sgd(nesterov: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(1)
    anchor, momentum = torch.randn(1000, generator=gen), torch.zeros(1000)
    param = torch.nn.Parameter(anchor.clone())
    opt = torch.optim.SGD([param], lr=0.7, momentum=0.9, nesterov=nesterov)
    for _ in range(3):
        grad = torch.randn(1000, generator=gen)
        # computing the update in the gradient's own memory, piece by piece, gives the same bits
        with monkeypatch.context() as patch:
            patch.setattr(tensors, "STEP_CHUNK", 7)  # 1000 values in 143 pieces
            same = outer_step(anchor, momentum, grad.clone(), 0.7, 0.9, nesterov, consume_grad=True)
        anchor, momentum = outer_step(anchor, momentum, grad, 0.7, 0.9, nesterov)
        assert torch.equal(same[0], anchor) and torch.equal(same[1], momentum)
        param.grad = grad.clone()
        opt.step()
    assert torch.allclose(anchor, param.detach(), rtol=0, atol=1e-5)


@pytest.mark.parametrize("nesterov", [True, False])
def test_without_momentum_the_step_keeps_no_buffer_and_gives_the_same_bits(nesterov: bool) -> None:
    gen = torch.Generator().manual_seed(2)
    anchor, grad = torch.randn(1000, generator=gen), torch.randn(1000, generator=gen)
    for lr in (1.0, 0.7):
        # what the momentum path computes with mu 0 (m = 0 mu + g = g; Nesterov adds 0 m), rounded once per op
        want = anchor.numpy() - grad.numpy() * np.float32(lr)
        got_anchor, got_m = outer_step(anchor, torch.zeros(0), grad.clone(), lr, 0.0, nesterov, consume_grad=True)
        assert np.array_equal(got_anchor.numpy(), want) and got_m.numel() == 0
        param = torch.nn.Parameter(anchor.clone())
        param.grad = grad.clone()
        torch.optim.SGD([param], lr=lr, momentum=0.0).step()
        assert torch.allclose(got_anchor, param.detach(), rtol=0, atol=1e-6)
    assert torch.equal(outer_step(anchor, torch.zeros(0), grad.clone(), 1.0, 0.0, nesterov)[0], anchor - grad)


def test_a_state_without_momentum_is_the_anchor_alone() -> None:
    cfg, plain = OuterSyncConfig(), OuterSyncConfig(outer_lr=1.0, outer_momentum=0.0)
    assert (cfg.momentum_elems(10), plain.momentum_elems(10)) == (10, 0)
    a = torch.ones(10)
    assert state_hash(a, torch.zeros(0)) != state_hash(a, torch.zeros(10))  # two rules: two namespaces anyway
    # a catch-up download moves half the bytes, and its bound shrinks with them
    big = 50_000_000
    assert plain.state_bound_s(big) == pytest.approx(cfg.state_bound_s(big) / 2)


def test_a_checkpoint_of_the_other_momentum_setting_keeps_its_anchor_and_fits_its_momentum() -> None:
    m = torch.full((5,), 0.5)
    assert fit_momentum(m, 5) is m
    assert fit_momentum(m, 0).numel() == 0  # DiLoCo's checkpoint resumed with plain averaging: dropped
    assert torch.equal(fit_momentum(torch.zeros(0), 5), torch.zeros(5))  # and the other way: zeros


def test_state_hash_covers_anchor_and_momentum() -> None:
    a, m = torch.ones(10), torch.zeros(10)
    assert state_hash(a, m) == state_hash(a.clone(), m.clone())
    assert state_hash(a, m) != state_hash(a, m + 1e-7) != state_hash(a * 2, m)


def test_model_fingerprint_follows_names_shapes_and_dtypes() -> None:
    def net(width: int, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Linear(width, 2)).to(dtype)

    assert model_fingerprint(net(8)) == model_fingerprint(net(8))
    assert model_fingerprint(net(8)) != model_fingerprint(net(9))
    assert model_fingerprint(net(8)) != model_fingerprint(net(8, torch.bfloat16))


def test_the_sync_namespace_follows_the_outer_rule_and_nothing_else() -> None:
    fp = "0123456789abcdef"
    default = sync_fingerprint(fp, OuterSyncConfig().rule())
    assert default == sync_fingerprint(fp, OuterSyncConfig(allreduce_timeout_s=9.0, sync_every=3).rule())
    for change in ({"outer_lr": 1.0}, {"outer_momentum": 0.0}, {"aggregator": "median"}, {"nesterov": False}):
        assert sync_fingerprint(fp, OuterSyncConfig(**change).rule()) != default, change


# ---- config and report -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"sync_every": 0}, "sync_every=0"),
        ({"compression": "int4"}, "none, fp16, int8"),
        ({"outer_lr": -1.0}, "outer_lr=-1.0"),
        ({"outer_momentum": 1.0}, "[0, 1)"),
        ({"commit_timeout_s": 0.0}, "commit_timeout_s=0.0"),
        ({"min_group_size": 1}, "at least 2"),
        ({"aggregator": "krum"}, "mean, trimmed_mean"),
    ],
)
def test_config_validation_names_the_value_and_the_fix(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(ValueError) as err:
        OuterSyncConfig(**kwargs)  # type: ignore[arg-type]
    assert fragment in str(err.value)


def test_the_all_reduce_and_state_bounds_grow_with_the_models_bytes_on_the_slowest_link() -> None:
    cfg = OuterSyncConfig(min_link_mbit=20.0)
    # 50M float32 parameters: a member moves ~2 x 200 MB each way, 160 s at 20 Mbit/s, plus a quarter
    assert cfg.allreduce_bound_s(50_000_000) == pytest.approx(200.0)
    assert OuterSyncConfig(compression="fp16").allreduce_bound_s(50_000_000) == pytest.approx(100.0)
    assert cfg.state_bound_s(50_000_000) == pytest.approx(200.0)  # anchor and momentum
    small = cfg.allreduce_bound_s(1_000_000), cfg.state_bound_s(1_000_000)
    assert small == (cfg.allreduce_timeout_s, cfg.state_timeout_s)  # a small model keeps the fixed bounds
    extra = cfg.max_sync_seconds(50_000_000) - cfg.max_sync_seconds(1_000_000)
    assert extra == pytest.approx(200.0 - cfg.allreduce_timeout_s + 200.0 - cfg.state_timeout_s)
    for compression in COMPRESSIONS:  # the bound's bytes cover what the encoding really sends
        assert encoded_size(10**6, compression) <= BYTES_PER_ELEMENT[compression] * 10**6 + 4  # a last scale


def test_config_bound_and_report_metrics() -> None:
    cfg = OuterSyncConfig(
        matchmaking_timeout_s=1, allreduce_timeout_s=2, commit_timeout_s=3, state_timeout_s=4, dht_timeout_s=1
    )
    window = MAX_WINDOW_FACTOR * 1  # the longest window an opener may ask for
    assert cfg.max_sync_seconds(1000) == window + 2 + max(3, 1) + 4 + 3 * cfg.ping_timeout_s + 6 * 1 + 1.0
    line = SyncReport(1.0, "p", 3, H0, True, 2, SyncOutcome.COMMITTED, 0.5, 10).to_metrics()
    assert line["event"] == "sync"
    keys = {"time", "peer", "revision", "state_hash", "committed", "group_size", "reason", "cause", "sync_s"}
    assert keys <= set(line) and (line["reason"], line["cause"]) == ("committed", "")
    assert line["phases"] == {}  # filled by OuterSync from the times its phases began
    aborted = SyncReport(1.0, "p", 3, H0, False, 2, SyncOutcome.ABORTED, 0.5, 0, cause=AbortCause.COMMIT_TIMEOUT)
    assert (aborted.to_metrics()["reason"], aborted.to_metrics()["cause"]) == ("aborted", "commit timeout")


# ---- signed records: forged and replayed ------------------------------------------------------


def test_records_round_trip_and_forgeries_are_rejected() -> None:
    alice, mallory = SigningKey(b"\x01" * 32), SigningKey(b"\x02" * 32)
    a = alice.peer_id
    genuine = seal_record(STATE_KIND, _state(a, 3, H0), alice)
    forged = seal(STATE_KIND, _state(a, 50, H1), mallory)  # names alice, signed by mallory
    tampered = genuine.replace(H0.encode(), H1.encode())
    kept, rejected = open_records(
        {a: genuine, mallory.peer_id: genuine, "x": forged, "y": tampered, "z": b"\xc1"},
        STATE_KIND,
        StateRecord.from_wire,
        lambda r: None,
        now=10.0,
    )
    assert list(kept) == [a] and kept[a].revision == 3
    assert len(rejected) == 4
    assert any("another peer's subkey" in r for r in rejected)
    assert any("bad signature" in r for r in rejected)
    with pytest.raises(ValueError):
        seal_record(STATE_KIND, _state(a, 1, H0), mallory)


def test_records_read_again_are_not_reopened_and_every_context_check_still_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a key flooded with valid records is read every round: each entry is verified once, not once per read
    keys = [SigningKey(bytes([i + 1]) * 32) for i in range(20)]
    raw = {k.peer_id: seal_record(STATE_KIND, _state(k.peer_id, 3, H0), k) for k in keys}
    raw["x"] = seal(STATE_KIND, _state(keys[0].peer_id, 50, H1), keys[1])  # forged: names keys[0]
    opens: list[bytes] = []
    real_open = records_module.open_record

    def counted(data: bytes, *rest: Any) -> Any:
        opens.append(data)
        return real_open(data, *rest)

    monkeypatch.setattr(records_module, "open_record", counted)
    memo = ContentMemo[Any](64)
    first = open_records(raw, STATE_KIND, StateRecord.from_wire, lambda r: None, 10.0, memo)
    assert len(opens) == 21
    again = open_records(raw, STATE_KIND, StateRecord.from_wire, lambda r: None, 10.0, memo)
    assert len(opens) == 21 and again == first and len(first[0]) == 20 and len(first[1]) == 1
    # a remembered record still meets the checks that depend on where and when it is read
    a, b = keys[0].peer_id, keys[1].peer_id
    moved = {b: raw[a]}
    assert open_records(moved, STATE_KIND, StateRecord.from_wire, lambda r: None, 10.0, memo)[0] == {}
    assert open_records(raw, STATE_KIND, StateRecord.from_wire, lambda r: "old", 10.0, memo)[0] == {}
    assert len(opens) == 21


def test_a_join_records_window_length_is_checked_and_may_be_absent() -> None:
    alice = SigningKey(b"\x01" * 32)
    a = alice.peer_id
    asked = JoinRecord(a, FP, 1, H0, 5.0, 5.0, window_s=12.5)
    assert JoinRecord.from_wire(asked.to_wire()) == asked
    older = {k: v for k, v in asked.to_wire().items() if k != "window_s"}  # a record from before the field
    assert JoinRecord.from_wire(older).window_s == 0.0
    for bad in (-1.0, float("inf"), float("nan"), 1e9, 3):
        with pytest.raises(MessageRejected, match="window_s"):
            JoinRecord.from_wire({**asked.to_wire(), "window_s": bad})
    sealed = seal_record(JOIN_KIND, asked, alice)
    assert len(sealed) <= MAX_RECORD_BYTES


def test_replayed_records_from_another_round_or_kind_are_rejected() -> None:
    alice = SigningKey(b"\x01" * 32)
    a = alice.peer_id
    gid_old, gid_now = "1" * 32, "2" * 32
    old_vote = seal_record(VOTE_KIND, VoteRecord(a, FP, 1, gid_old, D, 5.0), alice)
    kept, rejected = open_records(
        {a: old_vote},
        VOTE_KIND,
        VoteRecord.from_wire,
        lambda r: None if (r.revision, r.group_id) == (2, gid_now) else "vote of another round",
        now=10.0,
    )
    assert not kept and rejected == ["sync-vote: vote of another round"]
    old_join = seal_record(JOIN_KIND, JoinRecord(a, FP, 1, H0, 5.0, 5.0), alice)
    kept_joins, _ = open_records(
        {a: old_join}, JOIN_KIND, JoinRecord.from_wire, lambda r: None if r.revision == 2 else "old", 10.0
    )
    assert not kept_joins
    # a genuine state record replayed as a vote: the kind is signed too
    state = seal_record(STATE_KIND, _state(a, 2, H0), alice)
    kept, rejected = open_records({a: state}, VOTE_KIND, VoteRecord.from_wire, lambda r: None, 10.0)
    assert not kept and "envelope is of kind" in rejected[0]
    future = seal_record(STATE_KIND, _state(a, 2, H0, created=10_000.0), alice)
    assert not open_records({a: future}, STATE_KIND, StateRecord.from_wire, lambda r: None, 10.0)[0]


def test_prober_keeps_every_joiner_seen_expected_until_the_group_is_decided() -> None:
    # a member that decided first sends its part while this one still waits for pings: it must wait,
    # not be refused as an unknown group (the fresh-clone run lost 2 of 8 honest rounds to this)
    from swarm.sync.liveness import Prober

    class Service:
        def __init__(self) -> None:
            self.expected: frozenset[str] = frozenset()

        def expect(self, revision: int, joiners: Any) -> None:
            self.expected = frozenset(joiners)

        def expect_nothing(self) -> None:
            self.expected = frozenset()

        async def ping(self, peer: str, timeout: float) -> bool:
            return True

    class Member:  # a membership that stopped: no loop to run pings on
        loop = None

        def run(self, coro: Any, timeout: float) -> Any:
            coro.close()
            raise RuntimeError("membership is not started")

    service = Service()
    prober = Prober(MembershipLoop(cast(Any, Member())), "me", cast(Any, service), 0.05)
    prober.reset(3)
    prober.see(["a", "b"])
    assert prober.answered(["a", "b", "c"]) == set()  # no loop: nobody answers
    assert service.expected == {"a", "b", "c"}
    prober.expect(["a"])
    assert service.expected == {"a"}
    prober.reset(4)
    prober.see(["d"])
    assert service.expected == {"d"}


# ---- early close of the gather window ------------------------------------------------------------


def _closed(peer: str, window: float) -> JoinRecord:
    return JoinRecord(peer, FP, 0, H0, window, window + 0.5, True)


def _members_of(records: dict[str, JoinRecord], now: float, me: str) -> tuple[str, ...]:
    decision = decide_group(records, now, CFG, me)
    assert decision.status == "ready", decision
    return decision.members


def test_expected_members_are_last_rounds_joiners_and_peers_nearby() -> None:
    assert expected_members(["me", "a", "slow"], "me") == {"a", "slow"}
    # the slow peer sealed out of last round's window is not in its sealed view: its state record is
    assert expected_members(["me", "a"], "me", ["slow", "me"]) == {"a", "slow"}
    assert expected_members([], "me") == frozenset()  # first round, no one nearby: no early close


def test_close_only_once_every_expected_peer_joined_my_window() -> None:
    recs = {"a": _join("a", 10.0), "b": _join("b", 10.0), "c": _join("c", 11.0)}
    assert should_close(recs, "a", {"b"})
    assert not should_close(recs, "a", {"b", "c"})  # c is in another window
    assert not should_close(recs, "a", {"b", "ghost"})  # an expected key that never joins: no early close
    assert not should_close(recs, "a", set())
    assert not should_close({**recs, "a": _closed("a", 10.0)}, "a", {"b"})  # already closed
    assert not should_close(recs, "me", {"a"})  # not joined at all


def test_sealed_window_is_decided_early_with_the_same_group_as_at_its_end() -> None:
    recs = {p: _closed(p, 10.0) for p in "abc"}
    assert window_sealed(recs, 10.0)
    early = [decide_group(recs, 10.6, CFG, me) for me in "abc"]
    late = decide_group(recs, 14.0, CFG, "a")
    assert {d.status for d in early} == {"ready"}
    assert {d.group_id for d in early} == {late.group_id}


def test_one_open_record_keeps_the_window_running_to_its_end() -> None:
    # a late joiner (or a key that joins and never closes) only cancels the early close
    recs = {"a": _closed("a", 10.0), "b": _closed("b", 10.0), "late": _join("late", 10.0)}
    assert not window_sealed(recs, 10.0)
    assert decide_group(recs, 13.9, CFG, "a").status == "gather"
    assert _members_of(recs, 14.0, "a") == ("a", "b", "late")
    assert earliest_open_window(recs, 12.0, 4.0) == 10.0  # still open to joiners


def test_a_sealed_window_takes_no_joiner_and_closed_ghosts_turn_nobody_away() -> None:
    sealed = {"a": _closed("a", 10.0), "b": _closed("b", 10.0)}
    assert earliest_open_window(sealed, 11.0, 4.0) is None  # the arrival opens its own window
    assert earliest_open_window({**sealed, "c": _join("c", 10.5)}, 11.0, 4.0) == 10.5
    # a closed record of a key no one expects cannot seal a window an open member is in
    ghosted = {"a": _join("a", 10.0), "ghost": _closed("ghost", 10.0)}
    assert earliest_open_window(ghosted, 11.0, 4.0) == 10.0
    assert decide_group(ghosted, 11.0, CFG, "a").status == "gather"
    # and once the real members closed, the ghost is dropped by the liveness filter like any silent joiner
    ghosted["a"], ghosted["b"] = _closed("a", 10.0), _closed("b", 10.0)
    live = live_records(ghosted, {"b"}, "a")
    assert _members_of(live, 11.0, "a") == _members_of(sealed, 11.0, "a") == ("a", "b")


def test_race_late_joiner_after_a_close_ends_in_at_most_an_aborted_round() -> None:
    """a and b expect each other and close; ``late`` lands after a's sealing read but before b's."""
    a_view = {"a": _closed("a", 10.0), "b": _closed("b", 10.0)}
    b_view = {**a_view, "late": _join("late", 10.0)}
    a_decision = decide_group(a_view, 10.7, CFG, "a")
    assert a_decision.status == "ready" and a_decision.members == ("a", "b")
    # b sees the open record: it keeps gathering, and at the end forms another group
    assert decide_group(b_view, 10.7, CFG, "b").status == "gather"
    b_decision, late_decision = decide_group(b_view, 14.0, CFG, "b"), decide_group(b_view, 14.0, CFG, "late")
    assert b_decision.group_id == late_decision.group_id != a_decision.group_id
    # every member of a's group must run a's group id for it to commit: b does not, so neither group
    # gets all its members' parts (the all-reduce fails, the round aborts) -- never two committing groups
    assert "b" in a_decision.members and b_decision.group_id != a_decision.group_id
    # the common case: late's record is seen before anyone's sealing read, so nobody decides early
    assert decide_group(b_view, 10.7, CFG, "a").status == "gather"


def test_race_every_view_order_gives_one_group_or_different_ids() -> None:
    """Whatever subset of the window's records each member saw, equal group ids mean equal members."""
    full = {"a": _closed("a", 10.0), "b": _closed("b", 10.0), "c": _join("c", 10.0), "d": _closed("d", 10.0)}
    decisions = []
    for n in range(1, len(full) + 1):
        for subset in itertools.combinations(sorted(full), n):
            view = {p: full[p] for p in subset}
            for me in subset:
                for now in (10.7, 14.0):
                    d = decide_group(view, now, CFG, me)
                    if d.status == "ready":
                        decisions.append(d)
                        if now < 14.0:
                            assert "c" not in d.members  # an open record never lets a window close early
    by_id: dict[str, tuple[str, ...]] = {}
    for d in decisions:
        assert by_id.setdefault(d.group_id, d.members) == d.members


def test_the_group_commits_at_the_largest_skip_its_members_ask_and_its_id_says_so() -> None:
    recs = {"a": _join("a", 10.0), "b": replace(_join("b", 10.0), skip=2)}
    decision = decide_group(recs, 15.0, CFG, "a")
    plain = decide_group({"a": _join("a", 10.0), "b": _join("b", 10.0)}, 15.0, CFG, "a")
    assert (decision.status, decision.skip, plain.skip) == ("ready", 2, 0)
    assert decision.group_id != plain.group_id  # a member seeing another skip is in another group


def test_a_join_record_asking_too_large_a_skip_is_malformed() -> None:
    alice = SigningKey.generate()
    ok = JoinRecord(alice.peer_id, FP, 1, H0, 5.0, 5.0, False, MAX_SKIP)
    assert JoinRecord.from_wire(ok.to_wire()) == ok
    with pytest.raises(MessageRejected, match="skip"):
        JoinRecord.from_wire({**ok.to_wire(), "skip": MAX_SKIP + 1})
