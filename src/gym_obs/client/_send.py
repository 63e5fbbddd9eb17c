"""The attempt loop of ``request()``: send, classify a failure, decide, back off, send again.

One loop for every path (telemetry off or on, first attempt or retry), so that there is exactly one place
where a request is sent. It takes an :class:`AttemptObserver` (``RequestObserver`` while telemetry is on)
or ``None``; the retry decisions are ``_retry``'s pure policy, the logging and sleeping happen here.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any, Final, Protocol

import aiohttp

from gym_obs.client._fair_connector import ARRIVAL, next_arrival
from gym_obs.client._options import RequestOptions, TransportFailure, TransportFailureHook
from gym_obs.client._pool_metrics import CONNECT_LABEL
from gym_obs.client._redirects import REDIRECT_STATUSES, follow_redirects
from gym_obs.client._retry import (
    Classification,
    Decision,
    Policy,
    RetryTracker,
    classify_failure,
    transport_failure_kind,
)
from gym_obs.client._sessions import Pool, current_config
from gym_obs.client.errors import is_response_head_error, response_head_error
from gym_obs.telemetry import inflight, names
from gym_obs.telemetry.logging import get_logger
from gym_obs.telemetry.redaction import redact_url, scrub_text

__all__ = ["LOG_EVERY_NTH_RETRY", "AttemptObserver", "send"]

LOG_EVERY_NTH_RETRY: Final = 10
"""After the first retry of a request (logged at once), every Nth retry logs a summary line."""

_UploadTracker: Any = getattr(aiohttp, "UploadTracker", None)
_log = get_logger("gym_obs.client")
_perf_counter = time.perf_counter
_UPLOAD_SETTLE_S: Final = 1.0
_ERROR_TEXT_CHARS: Final = 300


class AttemptObserver(Protocol):
    """What the loop tells about each attempt (``_observe.RequestObserver`` is the implementation)."""

    attempts: int
    """Attempts started so far; the loop sets it before each attempt."""

    def attempt_ok(self, response: aiohttp.ClientResponse, t0: float) -> None: ...

    def attempt_failed(
        self,
        err: BaseException,
        t0: float,
        attempt: int,
        failure: Classification | None,
        backoff_s: float,
        uploaded: bool,
    ) -> None: ...

    def retried(self, reason: str) -> None: ...


async def _body_uploaded(failure: Classification | None, tracker: Any) -> bool:
    """Whether the server may have received the whole request.

    No connection, nothing sent. Otherwise aiohttp's ``UploadTracker`` (3.14+) says whether the body went
    out in full; it settles when the body writer winds down, shortly after the failure surfaces, so it is
    given a moment. Without a tracker, or if it does not settle, the answer is the conservative "yes": the
    connection was made and the request handed to it.
    """
    if failure is not None and failure.category == "connect":
        return False
    if tracker is None:
        return True
    done: asyncio.Future[None] = tracker.upload_complete
    if not done.done():
        await asyncio.wait((done,), timeout=_UPLOAD_SETTLE_S)
        if not done.done():
            return True
    return done.exception() is None


async def _call_hook(hook: TransportFailureHook, failure: TransportFailure) -> None:
    try:
        result = hook(failure)
        if inspect.isawaitable(result):
            await result
    except Exception:
        _log.warning("transport_failure_hook_failed", destination=failure.destination, exc_info=True)


def _error_text(err: BaseException) -> str:
    text = str(err)
    if len(text) > _ERROR_TEXT_CHARS:
        text = text[:_ERROR_TEXT_CHARS] + "…"
    return f"{type(err).__qualname__}: {scrub_text(text)}" if text else type(err).__qualname__


def _log_retry(
    retry: RetryTracker, err: BaseException, reason: str, backoff_s: float, elapsed_s: float
) -> None:
    """First retry of a request: logged at once. Later ones: every Nth, as a summary (never silent)."""
    n = retry.retries
    if n == 1:
        _log.warning(
            "request_retry",
            method=retry.method,
            destination=retry.destination,
            reason=reason,
            error=_error_text(err),
            attempt=retry.attempts,
            backoff_s=round(backoff_s, 3),
        )
    elif n % LOG_EVERY_NTH_RETRY == 0:
        _log.warning(
            "request_still_retrying",
            method=retry.method,
            destination=retry.destination,
            retries=n,
            elapsed_s=round(elapsed_s, 3),
            reasons=dict(retry.reasons),
            last_error=_error_text(err),
        )


def _log_end(retry: RetryTracker, outcome: str, elapsed_s: float, **extra: Any) -> None:
    """Summary line for a request that was retried (``recovered`` or ``gave_up``)."""
    if retry.retries == 0:
        return
    log = _log.info if outcome == "recovered" else _log.warning
    log(
        "request_retries_summary",
        outcome=outcome,
        method=retry.method,
        destination=retry.destination,
        attempts=retry.attempts,
        elapsed_s=round(elapsed_s, 3),
        reasons=dict(retry.reasons),
        **extra,
    )


async def send(
    pool: Pool,
    method: str,
    url: Any,
    kwargs: dict[str, Any],
    options: RequestOptions,
    observer: AttemptObserver | None,
) -> aiohttp.ClientResponse:
    """Run attempts until one returns a response or the retry policy says stop.

    Attempt 1 costs what a bare aiohttp call costs, in one coroutine (every frame between the caller and
    aiohttp is passed through again each time the request resumes): the policy, the retry bookkeeping
    and the redacted destination are built only after a failure (:class:`_Retrying`). The request's
    arrival number is fixed here, once: a limited pool serves queued requests in that order, retries
    included.
    """
    token = ARRIVAL.set(next_arrival())
    # While telemetry is on, the connections this request opens are counted under its destination.
    label = None if observer is None else CONNECT_LABEL.set(options.server_name or names.EXTERNAL_SERVER_NAME)
    # aiohttp's UploadTracker: to honour ``_resend_after_disconnect=False``, or to report
    # ``gym.http.body_uploaded`` precisely for a request with a body while telemetry is on.
    track_upload = _UploadTracker is not None and (
        not options.resend_after_disconnect or (observer is not None and kwargs.get("data") is not None)
    )
    # Redirects are followed here, hop by hop, so trace context and session headers go only where the
    # propagation rule allows (aiohttp would forward them to any Location).
    kwargs["allow_redirects"] = False
    start = _perf_counter()
    attempt = 0
    retrying: _Retrying | None = None
    tracker: Any = None
    try:
        while True:
            attempt += 1
            # Per attempt, before it is sent: the one place that tells anyone about attempt ``attempt``.
            if inflight.TRACKING.enabled:  # the in-flight rollout table
                inflight.hop_attempt(url, attempt)
            if observer is None:
                session = pool.plain
            else:
                observer.attempts = attempt
                session = pool.for_attempt()
            if track_upload:
                tracker = kwargs["upload_tracker"] = _UploadTracker()
            t0 = _perf_counter() if observer is not None else start
            try:
                response = await session.request(method, url, **kwargs)
                if options.allow_redirects and response.status in REDIRECT_STATUSES:
                    response = await follow_redirects(
                        session, method, url, kwargs, response, options.max_redirects
                    )
                if options.read_body and response.status < 400:
                    try:
                        await response.read()
                    except BaseException:
                        response.close()
                        raise
            except Exception as exc:
                err: Exception = response_head_error(exc, method, url) if is_response_head_error(exc) else exc
            else:
                if observer is not None:
                    observer.attempt_ok(response, t0)
                if retrying is not None:
                    retrying.recovered(attempt, start)
                return response
            if retrying is None:
                retrying = _Retrying(method, url, options, observer)
            backoff_s = await retrying.after_failure(err, attempt, t0, start, tracker)  # or raises
            del err
            await asyncio.sleep(backoff_s)
    finally:
        ARRIVAL.reset(token)
        if label is not None:
            CONNECT_LABEL.reset(label)
        if inflight.TRACKING.enabled:
            inflight.hop_done()  # the in-flight rollout table: this rollout's hop ended


class _Retrying:
    """A request's retry state, made at its first failed attempt: the policy, the bookkeeping and the
    decisions, logs, telemetry and hook calls that follow a failure."""

    __slots__ = ("observer", "options", "policy", "retry")

    def __init__(
        self, method: str, url: Any, options: RequestOptions, observer: AttemptObserver | None
    ) -> None:
        self.retry = RetryTracker(method, redact_url(str(url)))
        self.policy = Policy.from_options(options, current_config())
        self.options = options
        self.observer = observer

    def recovered(self, attempt: int, start: float) -> None:
        self.retry.attempts = attempt
        _log_end(self.retry, "recovered", _perf_counter() - start)

    async def after_failure(
        self, err: Exception, attempt: int, t0: float, start: float, tracker: Any
    ) -> float:
        """Decide on attempt ``attempt``'s failure: return the backoff before the next attempt, or raise
        (the error itself, or ``RetriesExhaustedError`` chained to it when a limit ended the retries)."""
        retry, observer = self.retry, self.observer
        retry.attempts = attempt
        failure = classify_failure(err)
        uploaded = await _body_uploaded(failure, tracker)
        elapsed = _perf_counter() - start
        decision = retry.decide(failure, uploaded, elapsed, self.policy)
        if observer is not None:
            observer.attempt_failed(err, t0, attempt, failure, decision.backoff_s, uploaded)
        hook = self.options.on_transport_failure
        if hook is not None and failure is not None:
            reported = _transport_failure(err, attempt, failure, uploaded, decision, elapsed, retry)
            await _call_hook(hook, reported)
        if not decision.retry:
            if decision.exhausted_by is not None and attempt > 1:
                exhausted = retry.exhausted_error(decision, err, elapsed)
                _log_end(retry, "gave_up", elapsed, limit=decision.exhausted_by)
                raise exhausted from err
            _log_end(retry, "gave_up", elapsed, error=type(err).__qualname__)
            raise err
        assert failure is not None
        _log_retry(retry, err, failure.reason, decision.backoff_s, elapsed)
        if observer is not None:
            observer.retried(failure.reason)
        return decision.backoff_s


def _transport_failure(
    err: BaseException,
    attempt: int,
    failure: Classification,
    uploaded: bool,
    decision: Decision,
    elapsed: float,
    retry: RetryTracker,
) -> TransportFailure:
    return TransportFailure(
        error=err,
        attempt=attempt,
        reason=failure.reason,
        body_uploaded=uploaded,
        will_retry=decision.retry,
        backoff_s=decision.backoff_s,
        elapsed_s=elapsed,
        destination=retry.destination,
        failure_kind=transport_failure_kind(failure.reason, err),
    )
