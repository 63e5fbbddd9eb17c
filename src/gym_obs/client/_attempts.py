"""The attempt loop of ``request()``: send, classify a failure, decide, back off, send again.

Shared by the telemetry-off and telemetry-on paths; the latter passes a recorder (``_telemetry``) that
turns each attempt into a duration point, a span event and, for a retry, a counter increment.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aiohttp

from gym_obs.client._retry import Policy, RetryTracker, TransportFailure, _Failure, classify_failure
from gym_obs.telemetry.logging import get_logger
from gym_obs.telemetry.redaction import redact_url

if TYPE_CHECKING:
    from gym_obs.client._sessions import _Pool
    from gym_obs.client._telemetry import Recorder

__all__ = ["TransportFailureHook", "needs_upload_tracking", "send_with_retries"]

TransportFailureHook = Callable[[TransportFailure], object]
"""Called with every failed attempt (sync or async); its errors are logged, never raised."""

_UploadTracker: Any = getattr(aiohttp, "UploadTracker", None)
_log = get_logger("gym_obs.client")
_perf_counter = time.perf_counter
_UPLOAD_SETTLE_S = 1.0


async def _body_uploaded(failure: _Failure | None, tracker: Any) -> bool:
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


def needs_upload_tracking(policy_resend: bool, traced: bool, kwargs: dict[str, Any]) -> bool:
    """Whether attempts need aiohttp's UploadTracker: to honour ``_resend_after_disconnect=False``, or
    to report ``gym.http.body_uploaded`` precisely for a request with a body while telemetry is on."""
    return _UploadTracker is not None and (not policy_resend or (traced and kwargs.get("data") is not None))


async def send_with_retries(
    pool: _Pool,
    method: str,
    url: Any,
    kwargs: dict[str, Any],
    policy: Policy,
    read_body: bool,
    hook: TransportFailureHook | None,
    recorder: Recorder | None,
    first_error: Exception | None = None,
    started: float | None = None,
    first_t0: float = 0.0,
) -> aiohttp.ClientResponse:
    """Run attempts until one returns a response or the policy says stop.

    ``first_error``: the caller already made attempt 1 inline (started at ``started``, the time the
    request began, and ``first_t0``, the attempt's start; both ``time.perf_counter()``) and it failed
    with this error. ``recorder`` set means telemetry is on.
    """
    retry = RetryTracker(method, "")
    start = _perf_counter() if started is None else started
    err: Exception | None = first_error
    tracker: Any = None
    t0 = first_t0
    if err is not None:
        retry.attempts = 1
    track_upload = needs_upload_tracking(policy.resend_after_disconnect, recorder is not None, kwargs)
    while True:
        if err is None:
            retry.attempts += 1
            if recorder is not None:
                recorder.attempts = retry.attempts
            if track_upload:
                tracker = kwargs["upload_tracker"] = _UploadTracker()
            session = pool.plain if recorder is None else pool.for_attempt()
            t0 = _perf_counter()
            try:
                response = await session.request(method, url, **kwargs)
                if read_body and response.status < 400:
                    try:
                        await response.read()
                    except BaseException:
                        response.close()
                        raise
            except Exception as exc:
                err = exc
            else:
                if recorder is not None:
                    recorder.attempt_ok(response, t0)
                if retry.retries:
                    retry.log_end("recovered", _perf_counter() - start)
                return response

        failure = classify_failure(err)
        uploaded = await _body_uploaded(failure, tracker)
        elapsed = _perf_counter() - start
        decision = retry.decide(failure, uploaded, elapsed, policy)
        if not retry.destination:
            retry.destination = redact_url(str(url))
        if recorder is not None:
            recorder.attempt_failed(err, t0, retry.attempts, failure, decision.backoff_s, uploaded)
        if hook is not None and failure is not None:
            await _call_hook(
                hook,
                TransportFailure(
                    error=err,
                    attempt=retry.attempts,
                    reason=failure.reason,
                    body_uploaded=uploaded,
                    will_retry=decision.retry,
                    backoff_s=decision.backoff_s,
                    elapsed_s=elapsed,
                    destination=retry.destination,
                ),
            )
        if not decision.retry:
            if decision.exhausted_by is not None and retry.attempts > 1:
                exhausted = retry.exhausted_error(decision, err, elapsed)
                retry.log_end("gave_up", elapsed, limit=decision.exhausted_by)
                raise exhausted from err
            retry.log_end("gave_up", elapsed, error=type(err).__qualname__)
            raise err
        assert failure is not None
        retry.log_retry(err, failure.reason, decision.backoff_s, elapsed)
        if recorder is not None:
            recorder.retried(failure.reason)
        err = None
        await asyncio.sleep(decision.backoff_s)
