"""Failure reports on collection rows survive a JSON-lines round trip."""

from __future__ import annotations

import orjson
import pytest

from gym_obs.failures import (
    FailureReport,
    InvalidFailureReport,
    NgFailureEvent,
    failure_report_for,
    read_report_from_row,
    rebuild_failure,
    store_report_on_row,
)
from gym_obs.failures.rows import ROW_FAILURE_EVENTS_KEY, ROW_FAILURE_ID_KEY


def test_row_round_trip_through_json_lines() -> None:
    final = NgFailureEvent("verifier_error", "verify", boundary="resources_server")
    final.__cause__ = ZeroDivisionError("division by zero")
    report = failure_report_for(final)
    row = store_report_on_row({"task_index": 3, "reward": 0.0}, report)
    assert row[ROW_FAILURE_ID_KEY] == final.event_id
    assert set(row[ROW_FAILURE_EVENTS_KEY]) == set(report.events)
    line = orjson.dumps(row)
    back = read_report_from_row(orjson.loads(line))
    assert back is not None
    assert back.failure_id == report.failure_id and back.events == report.events
    rebuilt = rebuild_failure(back)
    assert rebuilt is not None and str(rebuilt.__cause__) == "ZeroDivisionError: division by zero"


def test_rows_without_a_report() -> None:
    assert read_report_from_row({"task_index": 1}) is None
    row = store_report_on_row({ROW_FAILURE_ID_KEY: "x", ROW_FAILURE_EVENTS_KEY: {}}, FailureReport())
    assert ROW_FAILURE_ID_KEY not in row and ROW_FAILURE_EVENTS_KEY not in row
    assert store_report_on_row({}, None) == {}


@pytest.mark.parametrize(
    "row",
    [
        {ROW_FAILURE_EVENTS_KEY: [], ROW_FAILURE_ID_KEY: None},
        {ROW_FAILURE_EVENTS_KEY: {"fe_bad": {}}, ROW_FAILURE_ID_KEY: None},
        {ROW_FAILURE_EVENTS_KEY: {}, ROW_FAILURE_ID_KEY: "fe_" + "0" * 24},
        {ROW_FAILURE_EVENTS_KEY: {"k": 5}},
    ],
)
def test_corrupt_rows_raise_invalid_failure_report(row: dict[str, object]) -> None:
    with pytest.raises(InvalidFailureReport):
        read_report_from_row(row)
