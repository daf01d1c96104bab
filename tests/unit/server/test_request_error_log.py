"""RequestErrorLog: a flood of one kind of refusal costs a line a second, and says what it left out."""

from __future__ import annotations

import logging

import pytest

from inferd.server.logging import RequestErrorLog
from inferd.testing.fakes import FakeClock

LOGGER = "tests.request_errors"


def lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name == LOGGER]


def test_a_flood_is_logged_in_a_burst_then_a_line_a_second_with_what_was_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    clock = FakeClock()
    log = RequestErrorLog(logging.getLogger(LOGGER), burst=3, per_second=1.0, clock=clock)
    for index in range(10):
        log.log(False, "OVERLOADED", "request %d refused", index, extra={"request_id": str(index)})
    assert [r.getMessage() for r in lines(caplog)] == [f"request {i} refused" for i in range(3)]
    clock.advance(1.0)
    log.log(False, "OVERLOADED", "request %d refused", 10, extra={"request_id": "10"})
    last = lines(caplog)[-1]
    assert last.getMessage() == "request 10 refused (7 more like it not logged)"
    assert last.suppressed == 7 and last.request_id == "10"  # type: ignore[attr-defined]
    assert last.levelno == logging.WARNING


def test_kinds_have_their_own_allowance_and_faults_are_always_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    log = RequestErrorLog(logging.getLogger(LOGGER), burst=1, per_second=1.0, clock=FakeClock())
    for _ in range(5):
        log.log(False, "OVERLOADED", "shed", extra={})
        log.log(False, "INVALID_ARGUMENT", "bad", extra={})
        log.log(True, "INTERNAL", "fault", extra={})
    assert [r.getMessage() for r in lines(caplog)].count("shed") == 1
    assert [r.getMessage() for r in lines(caplog)].count("bad") == 1
    faults = [r for r in lines(caplog) if r.getMessage() == "fault"]
    assert len(faults) == 5 and all(r.levelno == logging.ERROR for r in faults)
