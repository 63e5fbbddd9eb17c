"""raise_boundary_failure: turn a gym server's failure reply back into the failure it reported.

The report (``{"ng_failure_report": …}`` in a JSON error body, else the ``X-NG-Failure-Report`` header) is
hostile until validated; if it is not valid or names no final failure, the caller gets exactly what
:func:`raise_for_status` raises, so an invalid report can never hide the original HTTP status and body.

One report per reply is decoded and validated, once: the body's when it names a final failure (it is the
complete one), else the header's (the same report, maybe truncated to fit a header). The header is only
decoded when the body has no usable report.
"""

from __future__ import annotations

import logging

import aiohttp
import orjson

from gym_obs.client.errors import read_error_body, response_error
from gym_obs.failures._codec import decode_report
from gym_obs.failures.errors import InvalidFailureReport
from gym_obs.failures.event import NgFailureEvent
from gym_obs.failures.report import FailureReport, rebuild_failure
from gym_obs.failures.transport import (
    FAILURE_REPORT_BODY_KEY,
    current_failure_log,
    observe_reply,
    report_from_reply_header,
)

__all__ = ["raise_boundary_failure", "report_from_reply_body"]

_log = logging.getLogger("gym_obs.client")


async def raise_boundary_failure(
    response: aiohttp.ClientResponse, content: bytes | str | None = None
) -> None:
    """Re-raise a remote gym failure for an error reply; observe forwarded reports on a success reply.

    Error reply (status >= 400) with a valid report naming a final failure: raises that failure rebuilt
    with its original ids and causes, ``http_error`` set to this hop's
    :class:`~gym_obs.client.errors.ResponseError` (status, bounded body, redacted request info). Any other
    error reply: raises that ``ResponseError``.
    Success reply: merges a forwarded report (recovered failures) into the current request's failure log and
    returns. Never raises anything else.
    """
    if response.status < 400:
        observe_reply(response)
        return
    body = await read_error_body(response, content)
    http_error = response_error(response, body)
    try:
        failure = _remote_failure(response, body)
    except Exception:  # pragma: no cover - every step is total; this keeps the promise regardless
        _log.debug("failed to read a remote failure report", exc_info=True)
        failure = None
    if failure is None:
        raise http_error
    failure.http_error = http_error
    raise failure


def report_from_reply_body(body: bytes | str | None) -> FailureReport | None:
    """The valid report under ``"ng_failure_report"`` in a JSON object body, else ``None``; never raises."""
    if not body:
        return None
    try:
        text = (body.encode("utf-8", "replace") if isinstance(body, str) else body).lstrip()
        if not text.startswith(b"{"):
            return None
        document = orjson.loads(text)
        if not isinstance(document, dict):
            return None
        value = document.get(FAILURE_REPORT_BODY_KEY)
        if value is None:
            return None
        if isinstance(value, str):
            return decode_report(value)
        return FailureReport.from_payload(value)
    except (InvalidFailureReport, orjson.JSONDecodeError):
        return None
    except Exception:
        _log.debug("unreadable failure report in a reply body", exc_info=True)
        return None


def _remote_failure(response: aiohttp.ClientResponse, body: bytes | None) -> NgFailureEvent | None:
    """The final failure of the body's report (complete) or else of the header's (maybe truncated); each
    report that is read is merged into the current request's failure log."""
    log = current_failure_log()
    report = report_from_reply_body(body)
    if report is not None and log is not None:
        log.merge(report)
    if report is None or report.failure_id is None:
        report = report_from_reply_header(response)
        if report is not None and log is not None:
            log.merge(report)
    if report is None or report.failure_id is None:
        return None
    return rebuild_failure(report)
