"""Failure log and exception reply: every failure a request saw goes back to its caller as a report.

One step per server (``FailureReplies``, run in the gym layers' one frame, ``_steps``; inside the SERVER
span, so events carry its trace and span ids):
- the request's exchange is the current failure-log holder while the request runs; handlers and the
  client observe into it (the ``RequestFailureLog`` is made on the first record);
- every reply of a request that observed failures carries ``X-NG-Failure-Report`` (success replies too:
  a model attempt that a retry recovered is still reported);
- an unhandled ``NgFailureEvent`` answers with an error status this hop chooses (:func:`reply_status`:
  its own ``http_status`` if it is a 4xx/5xx, 500 for a failure another server reported) and a JSON
  body holding the report; any other exception becomes an ``internal_error`` event at this server's
  boundary with the exception as its (foreign) cause; an HTTP error reply from an inner gym call keeps the
  inner event as cause, one without a gym report puts its bounded, scrubbed body in the reason.
Bodies carry the bounded, scrubbed report only: never a traceback, never the exception's raw text.
A failure reply is built once: the chain is walked once, the report goes into the body and (encoded once,
by the same start hook that reports recovered failures on a success) into the header.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import aiohttp
import orjson
from starlette.types import ASGIApp, Message, Send

from gym_obs.client.boundary import report_from_reply_body
from gym_obs.failures.event import NgFailureEvent, exception_type_name
from gym_obs.failures.kinds import Boundary
from gym_obs.failures.report import FailureReport, find_boundary_failure, rebuild_failure
from gym_obs.failures.transport import (
    FAILURE_REPORT_BODY_KEY,
    FAILURE_REPORT_HEADER,
    RequestFailureLog,
    encode_failure_report,
    enter_failure_log,
    leave_failure_log,
    observe_failure,
    report_from_reply_header,
)
from gym_obs.server._exchange import Exchange
from gym_obs.server._steps import RequestSteps
from gym_obs.telemetry._state import STATE
from gym_obs.telemetry.bodies import bounded_excerpt

__all__ = [
    "FailureReplies",
    "FailureReplyMiddleware",
    "boundary_for_server_type",
    "failure_for_exception",
    "failure_reply",
    "reply_status",
]

_REPORT_HEADER: Final = FAILURE_REPORT_HEADER.lower().encode("latin-1")
_DEFAULT_STATUS: Final = 500
_UPSTREAM_BODY_CHARS: Final = 500  # of an upstream's error body in this hop's failure reason
_MIN_ERROR_STATUS: Final = 400
_MAX_ERROR_STATUS: Final = 599
_BOUNDARIES: Final[dict[str, Boundary]] = {
    "responses_api_models": "model",
    "resources_servers": "resources_server",
    "responses_api_agents": "agent",
}

_log = logging.getLogger("gym_obs.server")


def boundary_for_server_type(server_type: str | None) -> Boundary:
    """The failure boundary a server of ``server_type`` reports as (``harness`` for other types)."""
    return _BOUNDARIES.get(server_type or "", "harness")


def _inner_failure(error: aiohttp.ClientResponseError) -> NgFailureEvent | None:
    """The gym failure an inner call's error reply reported (body first, then header), if any."""
    report: FailureReport | None = report_from_reply_body(getattr(error, "response_content", None))
    if report is None or report.failure_id is None:
        headers = error.headers
        report = report_from_reply_header(dict(headers)) if headers is not None else None
    return rebuild_failure(report) if report is not None and report.failure_id is not None else None


def failure_for_exception(error: BaseException, boundary: Boundary) -> NgFailureEvent:
    """The event to reply with for an unhandled ``error`` (the error itself when it is a gym event)."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]  # a task group around one failure (anyio, BaseHTTPMiddleware)
    if isinstance(error, NgFailureEvent):
        return error
    inner: NgFailureEvent | None = None
    # The message travels once, scrubbed, on the foreign cause record; the reason names the type only...
    reason = f"unhandled {exception_type_name(error)}"
    if isinstance(error, aiohttp.ClientResponseError):
        inner = _inner_failure(error) or find_boundary_failure(error)
        if inner is None:
            # ...except for an upstream's error reply without a gym report: its body is what says what
            # went wrong (bounded and scrubbed), and the foreign cause only knows the status line.
            reason += _upstream_reply(error)
    event = NgFailureEvent("internal_error", reason, boundary=boundary, http_status=_DEFAULT_STATUS)
    event.__cause__ = inner if inner is not None else error
    return event


def _upstream_reply(error: aiohttp.ClientResponseError) -> str:
    """``: upstream replied 500: <bounded, scrubbed body>`` (the body part only when there is one)."""
    text = f": upstream replied {error.status}"
    content = getattr(error, "response_content", None)
    if isinstance(content, bytes | str) and content:
        text += ": " + bounded_excerpt(content, _UPSTREAM_BODY_CHARS)
    return text


def reply_status(event: NgFailureEvent) -> int:
    """The status of this hop's failure reply for ``event``: always an error status chosen here.

    A failure raised at this server answers with its own ``http_status`` when that is an error status
    (4xx/5xx), else 500. A failure another server reported (re-raised by ``raise_boundary_failure``)
    always answers 500: its ``http_status`` is what that hop answered, kept in the record, and reusing it
    would let a peer choose this server's reply (``200`` turns a failure into a success, ``204`` leaves a
    body on the connection, ``401`` makes the caller re-authenticate).
    """
    if _is_remote(event):
        return _DEFAULT_STATUS
    status = event.http_status
    if status is None or not _MIN_ERROR_STATUS <= status <= _MAX_ERROR_STATUS:
        return _DEFAULT_STATUS
    return status


def _is_remote(event: NgFailureEvent) -> bool:
    """Whether ``event`` was rebuilt from another server's report (not raised in this process)."""
    if event.http_error is not None:  # set by raise_boundary_failure on the events it rebuilds
        return True
    origin = event.server_name
    return origin is not None and STATE.server_name is not None and origin != STATE.server_name


class FailureReplies:
    """The failure-reply step: keeps the request's failure log, reports it on every reply, turns exceptions
    into failure replies.

    It shares the request's :class:`~gym_obs.server._exchange.Exchange` with the other gym layers: the
    exchange holds the log, the report header is its report hook, and no reply is attempted once the reply
    started or the caller is gone (the disconnect step, inside this one, says so).
    """

    __slots__ = ("boundary", "restore_query")

    def __init__(self, *, boundary: Boundary = "harness", restore_query: bool = True) -> None:
        self.boundary = boundary
        #: whether an outer layer may have hidden the query from contrib's SERVER span (see
        #: ``_instrumentation``): then it is given back first; a stack without contrib skips the look
        self.restore_query = restore_query

    @staticmethod
    def report_hook(exchange: Exchange, message: Message) -> Message:
        """The exchange's start hook when there is a report (see ``_exchange``): ``X-NG-Failure-Report``
        for the failure replied with, else for what was observed."""
        report = exchange.final_report
        if report is None:
            log = exchange.failure_log
            if log is None or not len(log):
                return message
            report = log.report()
        value = encode_failure_report(report) if report is not None else ""
        if not value:
            return message
        headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != _REPORT_HEADER]
        headers.append((_REPORT_HEADER, value.encode("latin-1")))
        return {**message, "headers": headers}

    #: the request starts: its exchange holds its failure log (``enter(exchange) -> token``, the context
    #: variable's own method; ``leave(token)`` when it ends)
    enter = staticmethod(enter_failure_log)
    leave = staticmethod(leave_failure_log)

    @staticmethod
    def settles(error: Exception, exchange: Exchange) -> bool:
        """Whether ``error`` out of the app ends here (a failure reply, or nothing for a caller that is
        gone); False: it propagates (the reply started: too late for a failure reply)."""
        if exchange.caller_gone:  # the caller is gone: nothing is sent, the error is only logged
            _log.warning("handler failed after the caller disconnected", exc_info=error)
            return True
        if exchange.response_started:
            _log.error("handler failed after the reply started", exc_info=error)
            return False
        return True

    async def reply(self, error: Exception, exchange: Exchange, send: Send) -> None:
        """Answer ``error`` with a failure reply holding the request's report."""
        event = failure_for_exception(error, self.boundary)
        log = exchange.failure_log
        if log is None:  # (made before the event is observed into it, as a log made up front would be)
            log = exchange.failure_log = RequestFailureLog()
        status, body = failure_reply(event, log, exchange)
        if event is error:
            _log.warning("replying with failure %s (%s)", event.event_id, event)
        else:
            _log.error(
                "unhandled exception; replying with failure %s (%s)", event.event_id, event, exc_info=error
            )
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode("latin-1")),
        ]
        # The start hooks add the report header (from exchange.final_report) and a new session's token.
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class FailureReplyMiddleware(RequestSteps):
    """:class:`FailureReplies` as a pure ASGI middleware of its own (``SimpleServer`` runs it as a step)."""

    __slots__ = ()

    def __init__(self, app: ASGIApp, *, boundary: Boundary = "harness", restore_query: bool = True) -> None:
        super().__init__(app, failures=FailureReplies(boundary=boundary, restore_query=restore_query))


def failure_reply(event: NgFailureEvent, log: RequestFailureLog, exchange: Exchange) -> tuple[int, bytes]:
    """Observe ``event`` and build its reply once: the status and the JSON body holding the report.

    The cause chain is walked once (``observe_failure`` returns the walk, the log's report is built around
    it); the report is kept on ``exchange`` for the header hook, which encodes it once.
    """
    report = log.report_around(observe_failure(event))
    exchange.final_report = report
    payload: dict[str, Any] = {"detail": str(event)}
    if report is not None:
        payload[FAILURE_REPORT_BODY_KEY] = report.to_payload()
    return reply_status(event), orjson.dumps(payload)
