"""A node's rounds feed its peer watch: a peer heard, then silent, is warned about once and cleared once.

In-process (the fakes of tests/node/test_round.py, a fake clock): the node's own collect results are what
it hears, so the wiring is checked, not only the pure decision (tests/node/test_alerts.py).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from node.observe.logs import PROGRESS
from swarm.exchange import CollectResult
from tests.fakes import FakeClock
from tests.node.test_round import T0, Harness, NodeMaker, accepted, clock, informative, make_node, peer_ids

__all__ = ["clock", "make_node"]  # fixtures, used by name


def _said(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == PROGRESS and text in r.getMessage()]


def test_a_silent_last_peer_is_warned_about_once_and_its_return_clears_it(
    make_node: NodeMaker, clock: FakeClock, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    (peer,) = peer_ids(tmp_path, 1)
    h = Harness()
    clock.now = T0
    node = make_node(h)
    node.start_watch()
    caplog.set_level(logging.INFO, logger=PROGRESS)
    for i in range(3):  # the peer publishes every round
        h.exchange.queued.append(CollectResult([accepted(peer, [informative(i)], now=clock.now)], [], 1, 0.0))
        node.run_round()
        clock.advance(1.0)
    for _ in range(10):  # then nothing for 100 s
        clock.advance(10.0)
        node.run_round()
    gone = _said(caplog, "has not been heard for")
    assert len(gone) == 1 and gone[0].levelno == logging.WARNING, [r.getMessage() for r in caplog.records]
    assert peer[-6:] in gone[0].getMessage()
    h.exchange.queued.append(CollectResult([accepted(peer, [informative(9)], now=clock.now)], [], 1, 0.0))
    node.run_round()
    node.run_round()
    assert len(_said(caplog, "hearing 1 peer(s)")) == 1
    assert len(_said(caplog, "has not been heard for")) == 1, "raised once, not per round"
