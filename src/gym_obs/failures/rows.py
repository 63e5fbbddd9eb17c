"""Failure reports on collection rows (JSON lines): stored beside the row's data, read back validated.

A row keeps the event map under ``_ng_failure_events`` and the final failure's id under ``_ng_failure_id``,
so a dataset of rollouts can be grouped by root cause without re-running anything. Whether events were cut
stays visible on the records themselves (``skipped``).
"""

from __future__ import annotations

from typing import Any, Final

from gym_obs.failures._base import MAX_SKIPPED
from gym_obs.failures.report import FailureReport

__all__ = ["ROW_FAILURE_EVENTS_KEY", "ROW_FAILURE_ID_KEY", "read_report_from_row", "store_report_on_row"]

ROW_FAILURE_EVENTS_KEY: Final = "_ng_failure_events"
ROW_FAILURE_ID_KEY: Final = "_ng_failure_id"


def store_report_on_row(row: dict[str, Any], report: FailureReport | None) -> dict[str, Any]:
    """Set the two row keys from ``report`` (``None`` or an empty report clears them); returns ``row``."""
    if report is None or (report.failure_id is None and not report.events):
        row.pop(ROW_FAILURE_EVENTS_KEY, None)
        row.pop(ROW_FAILURE_ID_KEY, None)
        return row
    row[ROW_FAILURE_EVENTS_KEY] = {eid: dict(record) for eid, record in report.events.items()}
    row[ROW_FAILURE_ID_KEY] = report.failure_id
    return row


def read_report_from_row(row: dict[str, Any]) -> FailureReport | None:
    """The report stored on ``row``; ``None`` when the row has none, ``InvalidFailureReport`` if corrupt.

    ``dropped`` is reconstructed from the records' ``skipped`` counts (the row keeps only the two keys).
    """
    events = row.get(ROW_FAILURE_EVENTS_KEY)
    failure_id = row.get(ROW_FAILURE_ID_KEY)
    if events is None and failure_id is None:
        return None
    report = FailureReport.from_payload(
        {"failure_id": failure_id, "events": events if events is not None else {}}
    )
    skipped = sum(record.get("skipped", 0) for record in report.events.values())
    report.truncated = skipped > 0
    report.dropped = min(skipped, MAX_SKIPPED)
    return report
