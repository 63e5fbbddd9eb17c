"""Failure reports across HTTP hops: the header codec, the per-request failure log and observation.

A server keeps one :class:`RequestFailureLog` per request: a context variable holds the request's
*holder* (anything with a ``failure_log`` attribute; the server's per-request exchange), so tasks spawned by
the handler and threads it runs share it, and the log itself is only made when a failure is first recorded
(most requests record none and pay for no log). ``observe_failure`` records a failure where it is first
seen — a retry may still recover from it — and counts it once (``gym.failure.events`` plus an
``exception`` span event). ``observe_reply`` merges reports forwarded by other gym servers without counting
them again. At reply time the server sends
the log's report around its final failure (``log.report_around(observe_failure(error))``: the chain walked
once) encoded in the ``X-NG-Failure-Report`` header (and, for an unhandled error, as
``{"ng_failure_report": payload}`` in the JSON body). No aiohttp or FastAPI here: a reply is anything with
a ``.headers`` mapping, or the mapping itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from contextvars import ContextVar, Token
from typing import Any, Final, Protocol

from opentelemetry import trace

from gym_obs.failures._base import MAX_EVENTS, MAX_SKIPPED
from gym_obs.failures._codec import MAX_MAX_BYTES, decode_report, encode_report
from gym_obs.failures._shrink import trim_to_count
from gym_obs.failures._validation import check_graph
from gym_obs.failures.errors import InvalidFailureReport
from gym_obs.failures.event import NgFailureEvent
from gym_obs.failures.kinds import failure_kind_label
from gym_obs.failures.report import FailureReport, _walk
from gym_obs.telemetry import names
from gym_obs.telemetry._state import STATE
from gym_obs.telemetry._types import AttributeValue
from gym_obs.telemetry.spans import record_exception

__all__ = [
    "FAILURE_REPORT_BODY_KEY",
    "FAILURE_REPORT_HEADER",
    "MAX_HEADER_CHARS",
    "FailureLogHolder",
    "RequestFailureLog",
    "current_failure_log",
    "current_log_holder",
    "decode_failure_report",
    "encode_failure_report",
    "enter_failure_log",
    "leave_failure_log",
    "observe_failure",
    "observe_reply",
    "report_from_reply_header",
    "request_failure_log",
]

FAILURE_REPORT_HEADER: Final = names.FAILURE_REPORT_HEADER
FAILURE_REPORT_BODY_KEY: Final = names.FAILURE_REPORT_BODY_KEY
_HEADER_LOWER: Final = FAILURE_REPORT_HEADER.lower()
MAX_HEADER_CHARS: Final = MAX_MAX_BYTES
"""A failure header longer than any encoder produces is not a report (a hostile or broken peer)."""

_log = logging.getLogger("gym_obs.failures")
_warned_invalid = False


class FailureLogHolder(Protocol):
    """Where one request keeps its failure log: ``None`` until a failure is recorded.

    A server's holder (its request's exchange) also carries the request's ``session`` (opaque here), so one
    context variable makes both current; a holder without one has ``session`` ``None``.
    """

    failure_log: RequestFailureLog | None
    session: object


_CURRENT_LOG: ContextVar[FailureLogHolder | None] = ContextVar("gym_obs_failure_log", default=None)


def encode_failure_report(report: FailureReport, max_bytes: int = 4096) -> str:
    """``report`` as an ASCII header value of at most ``max_bytes`` characters, versioned ``v1.``.

    What does not fit is cut by the stated rule (middle events first; the final failure and its root cause
    are kept) and marked as truncated; ``""`` means not even the final failure fits (send no header).
    """
    return encode_report(report, max_bytes)


def decode_failure_report(value: object) -> FailureReport:
    """Decode and validate a forwarded report; raises only ``InvalidFailureReport``, in bounded time."""
    return decode_report(value)


class RequestFailureLog:
    """The failures one request observed (its own and those forwarded by other gym servers)."""

    __slots__ = ("_dropped", "_events")

    def __init__(self) -> None:
        self._events: dict[str, dict[str, Any]] = {}
        self._dropped = 0

    def __len__(self) -> int:
        return len(self._events)

    @property
    def events(self) -> Mapping[str, Mapping[str, Any]]:
        """Observed records keyed by event id (read-only view; insertion order)."""
        return self._events

    def merge(self, report: FailureReport) -> None:
        """Add ``report``'s events not already present; never counts, never raises.

        A merge that would close a cycle or exceed the depth bound (only possible with inconsistent remote
        input) is refused as a whole; beyond ``MAX_EVENTS`` the newest events are cut by the drop rule.
        """
        new = {eid: record for eid, record in report.events.items() if eid not in self._events}
        self._dropped = min(self._dropped + report.dropped, MAX_SKIPPED)
        if not new:
            return
        combined = {**self._events, **new}
        try:
            check_graph(combined)
        except InvalidFailureReport:
            _warn_invalid("a forwarded failure report conflicts with events already observed")
            return
        combined, trimmed = trim_to_count(combined, None, MAX_EVENTS)
        self._events = combined
        self._dropped = min(self._dropped + trimmed, MAX_SKIPPED)

    def report(self, final: BaseException | None = None) -> FailureReport | None:
        """The report to send with the reply: ``final``'s failure (if any) plus every observed event.

        ``None`` when there is nothing to report. The final failure's chain takes precedence: observed
        events are added around it and cut first if the report would exceed ``MAX_EVENTS``. Walks
        ``final``'s chain; a caller that already has its report (``observe_failure`` returns it) uses
        :meth:`report_around` and walks the chain once.
        """
        return self.report_around(_walk(final)[0])

    def report_around(self, base: FailureReport) -> FailureReport | None:
        """:meth:`report` for a final failure already walked into ``base`` (empty: no final failure).

        An observed chain that cannot join ``base`` (only inconsistent remote input makes a cycle or an
        over-deep chain) is left out on its own; every other observed event is still reported.
        """
        if base.failure_id is None and not self._events:
            return None
        extra = {eid: record for eid, record in self._events.items() if eid not in base.events}
        combined = {**base.events, **extra}
        if extra:
            try:
                check_graph(combined)
            except InvalidFailureReport:
                combined = _join_fitting(base.events, extra)
        combined, trimmed = trim_to_count(combined, base.failure_id, MAX_EVENTS)
        dropped = min(base.dropped + self._dropped + trimmed, MAX_SKIPPED)
        return FailureReport.model_construct(
            failure_id=base.failure_id, events=combined, truncated=dropped > 0, dropped=dropped
        )


def _join_fitting(
    base: Mapping[str, dict[str, Any]], extra: Mapping[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """``base`` plus each chain of ``extra`` (head down to where it joins ``base``) that keeps the graph
    valid; the rare path behind a failed whole-map check, so one bad chain costs only itself."""
    combined = dict(base)
    referenced = {record["cause_id"] for record in extra.values()}
    for head in (eid for eid in extra if eid not in referenced):
        chain: dict[str, dict[str, Any]] = {}
        node: str | None = head
        while node is not None and node in extra and node not in chain and node not in combined:
            chain[node] = extra[node]
            node = extra[node]["cause_id"]
        if not chain:
            continue
        trial = {**combined, **chain}
        try:
            check_graph(trial)
        except InvalidFailureReport:
            continue
        combined = trial
    return combined


class request_failure_log:  # lower case: used like the function it replaced
    """Make a fresh log current for the duration of one request (outside the server: the harness, tests).

    A class rather than a ``@contextmanager`` generator: the generator machinery costs more than the log.
    It is its own holder; the server's layer uses :func:`enter_failure_log` with the request's exchange,
    which makes the log only when a failure is recorded.
    """

    __slots__ = ("_token", "failure_log", "session")

    def __init__(self) -> None:
        self.failure_log: RequestFailureLog | None = RequestFailureLog()
        outer = _CURRENT_LOG.get()
        #: the session of the request this log is made in (it stays current inside: see the holder)
        self.session: object = outer.session if outer is not None else None

    def __enter__(self) -> RequestFailureLog:
        self._token = _CURRENT_LOG.set(self)
        assert self.failure_log is not None
        return self.failure_log

    def __exit__(self, *_exc: object) -> None:
        _CURRENT_LOG.reset(self._token)


#: ``enter_failure_log(holder)``: make ``holder`` the current request's place for its failure log (the log
#: is made on the first record); pass the token it returns to ``leave_failure_log`` when the request ends.
#: The context variable's own methods: the server calls them on every request, a wrapper would double it.
enter_failure_log: Final[Callable[[FailureLogHolder | None], Token[FailureLogHolder | None]]] = (
    _CURRENT_LOG.set
)
leave_failure_log: Final[Callable[[Token[FailureLogHolder | None]], None]] = _CURRENT_LOG.reset


#: ``current_log_holder()``: the current request's failure-log holder (with its ``session``), or ``None``
current_log_holder: Final[Callable[[], FailureLogHolder | None]] = _CURRENT_LOG.get


def current_failure_log() -> RequestFailureLog | None:
    """The log of the request being handled (made now if it recorded nothing yet); ``None`` outside one."""
    holder = _CURRENT_LOG.get()
    if holder is None:
        return None
    log = holder.failure_log
    if log is None:
        log = holder.failure_log = RequestFailureLog()
    return log


def observe_failure(error: BaseException) -> FailureReport:
    """Record ``error``'s failures in the current log; count each gym event the first time it is seen.

    Events rebuilt from another process's report are never counted again (they were counted there).
    Never raises; returns the report of ``error`` (empty when it carries no gym failure).
    """
    try:
        report, gym_events = _walk(error)
    except Exception:  # pragma: no cover - the walker is total; this guards the request path anyway
        _log.exception("failed to walk a failure chain")
        return FailureReport.model_construct(failure_id=None, events={}, truncated=False, dropped=0)
    for event in gym_events:
        if not event._observed:
            event._observed = True
            _count(event)
    if report.events or report.dropped:  # (an empty report records nothing: no log is made for it)
        log = current_failure_log()
        if log is not None:
            log.merge(report)
    return report


def report_from_reply_header(reply: object) -> FailureReport | None:
    """The valid report in a reply's ``X-NG-Failure-Report`` header, else ``None``; never raises."""
    value = _header_value(reply)
    if value is None:
        return None
    if isinstance(value, str | bytes) and len(value) > MAX_HEADER_CHARS:
        _warn_invalid(f"ignored a forwarded failure report header over {MAX_HEADER_CHARS} characters")
        return None
    try:
        return decode_report(value)
    except InvalidFailureReport as exc:
        _warn_invalid(f"ignored an invalid forwarded failure report: {exc}")
        return None


def observe_reply(reply: object) -> FailureReport | None:
    """Merge the report forwarded in ``reply``'s header into the current log (never counted again).

    ``reply`` is a response object with ``.headers`` or a headers mapping. Returns the valid report, if
    any; an invalid header is logged and ignored. Never raises.
    """
    report = report_from_reply_header(reply)
    if report is not None:
        log = current_failure_log()
        if log is not None:
            log.merge(report)
    return report


def _header_value(reply: object) -> object:
    try:
        headers = getattr(reply, "headers", reply)
        if not isinstance(headers, Mapping):
            return None
        value = headers.get(FAILURE_REPORT_HEADER)
        if value is None:
            for key, item in headers.items():
                if isinstance(key, str) and key.lower() == _HEADER_LOWER:
                    return item
        return value
    except Exception:
        return None


def _count(event: NgFailureEvent) -> None:
    """The first observation: one counter increment and one span event. Off means a flag check."""
    if not STATE.enabled:
        return
    try:
        labels: dict[str, AttributeValue] = {
            names.ATTR_FAILURE_KIND: failure_kind_label(event.failure_kind),
            names.ATTR_FAILURE_BOUNDARY: event.boundary,
        }
        if event.stage is not None:
            labels[names.ATTR_FAILURE_STAGE] = event.stage
        instruments = STATE.instruments
        if instruments is not None:
            instruments.failure_events.add(1, labels)
        span = trace.get_current_span()
        if span.is_recording():
            record_exception(span, event, _span_attributes(event))
    except Exception:
        _log.debug("failed to record a failure event", exc_info=True)


def _span_attributes(event: NgFailureEvent) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {
        names.ATTR_FAILURE_EVENT_ID: event.event_id,
        names.ATTR_FAILURE_KIND: event.failure_kind,
        names.ATTR_FAILURE_BOUNDARY: event.boundary,
        names.ATTR_FAILURE_REASON: event.failure_reason,
    }
    if event.stage is not None:
        attributes[names.ATTR_FAILURE_STAGE] = event.stage
    if event.http_status is not None:
        attributes[names.ATTR_FAILURE_HTTP_STATUS] = event.http_status
    if event.cause_id is not None:
        attributes[names.ATTR_FAILURE_CAUSE_ID] = event.cause_id
    return attributes


def _warn_invalid(message: str) -> None:
    """Hostile peers must not flood the log: warn once per process, then debug."""
    global _warned_invalid
    if _warned_invalid:
        _log.debug(message)
    else:
        _warned_invalid = True
        _log.warning(message)
