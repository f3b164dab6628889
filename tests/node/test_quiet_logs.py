"""Quiet by default: the per-round line from ``-v`` on, and the libraries' known noise filtered where it arises."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator

import pytest

from node.observe.logs import P2PD_LEAVING, P2PD_LOGGER, PROGRESS, ROUNDS, DropMessage, configure_logging

TOUCHED = ("", PROGRESS, ROUNDS, "hivemind", P2PD_LOGGER, "transformers.utils.generic")


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """configure_logging changes process-wide state: put every logger it touches back afterwards."""
    saved = [(logging.getLogger(n), logging.getLogger(n).level, list(logging.getLogger(n).filters)) for n in TOUCHED]
    handlers = list(logging.getLogger().handlers)
    with warnings.catch_warnings():
        yield
    for logger, level, filters in saved:
        logger.setLevel(level)
        logger.filters[:] = filters
    logging.getLogger().handlers[:] = handlers


def test_rounds_lines_only_from_v() -> None:
    configure_logging(0)
    assert logging.getLogger(PROGRESS).isEnabledFor(logging.INFO)
    assert not logging.getLogger(ROUNDS).isEnabledFor(logging.INFO)
    configure_logging(1)
    assert logging.getLogger(ROUNDS).isEnabledFor(logging.INFO)


def test_p2pd_leaving_line_is_dropped_and_other_errors_are_kept() -> None:
    configure_logging(0)
    configure_logging(0)  # idempotent: one filter, not one per call
    logger = logging.getLogger(P2PD_LOGGER)
    assert sum(isinstance(f, DropMessage) for f in logger.filters) == 1
    text = f"error accepting connection: accept unix /tmp/p2pd.sock: {P2PD_LEAVING}"
    leaving = logger.makeRecord(P2PD_LOGGER, logging.ERROR, "", 0, text, (), None)
    other = logger.makeRecord(P2PD_LOGGER, logging.ERROR, "", 0, "failed to listen: permission denied", (), None)
    assert not logger.filter(leaving)
    assert logger.filter(other)


def test_transformers_cache_rename_warning_is_filtered_and_others_are_not() -> None:
    configure_logging(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.warn(
            "`past_key_values` is deprecated and will be removed in version 5.40.0 for `X.forward`. Use `cache`.",
            FutureWarning,
            stacklevel=1,
        )
        warnings.warn("something else is deprecated", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["something else is deprecated"]


def test_vv_shows_everything() -> None:
    configure_logging(2)
    assert not any(isinstance(f, DropMessage) for f in logging.getLogger(P2PD_LOGGER).filters)
