"""Adding the request's failure report to a response start message (shared by the reply middlewares)."""

from __future__ import annotations

from typing import Final

from starlette.types import Message

from gym_obs.failures.transport import FAILURE_REPORT_HEADER, RequestFailureLog, encode_failure_report

REPORT_HEADER: Final = FAILURE_REPORT_HEADER.lower().encode("latin-1")


def with_report_header(message: Message, log: RequestFailureLog) -> Message:
    """``message`` (an ``http.response.start``) with ``X-NG-Failure-Report`` for what ``log`` observed."""
    report = log.report()
    value = encode_failure_report(report) if report is not None else ""
    if not value:
        return message
    headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != REPORT_HEADER]
    headers.append((REPORT_HEADER, value.encode("latin-1")))
    return {**message, "headers": headers}
