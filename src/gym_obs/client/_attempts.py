"""The attempt loop of ``request()``: send, classify a failure, decide, back off, send again.

One loop for every path (telemetry off or on, first attempt or retry), so that there is exactly one place
where a request is sent. With telemetry on, a recorder (``_telemetry``) turns each attempt into a duration
point, a failed one into a span event and a retry into a counter increment.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aiohttp

from gym_obs.client._fair_connector import ARRIVAL, next_arrival
from gym_obs.client._redirects import DEFAULT_MAX_REDIRECTS, REDIRECT_STATUSES, follow_redirects
from gym_obs.client._retry import (
    Policy,
    RetryArgs,
    RetryTracker,
    TransportFailure,
    _Failure,
    classify_failure,
    policy_for,
)
from gym_obs.client.errors import is_response_head_error, response_head_error
from gym_obs.telemetry import inflight
from gym_obs.telemetry.logging import get_logger
from gym_obs.telemetry.redaction import redact_url

if TYPE_CHECKING:
    from gym_obs.client._sessions import _Pool
    from gym_obs.client._telemetry import Recorder

__all__ = ["TransportFailureHook", "send_with_retries"]

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


async def send_with_retries(
    pool: _Pool,
    method: str,
    url: Any,
    kwargs: dict[str, Any],
    retry_args: RetryArgs,
    read_body: bool,
    hook: TransportFailureHook | None,
    recorder: Recorder | None,
) -> aiohttp.ClientResponse:
    """Run attempts until one returns a response or the retry policy says stop.

    The one attempt loop of ``request()``, telemetry on (``recorder`` set) or off. The request's arrival
    number is fixed here, once: a limited pool serves queued requests in that order, retries included.
    """
    token = ARRIVAL.set(next_arrival())
    try:
        return await _send_with_retries(pool, method, url, kwargs, retry_args, read_body, hook, recorder)
    finally:
        ARRIVAL.reset(token)
        inflight.hop_done()  # the in-flight table: this rollout's hop ended


async def _send_with_retries(
    pool: _Pool,
    method: str,
    url: Any,
    kwargs: dict[str, Any],
    retry_args: RetryArgs,
    read_body: bool,
    hook: TransportFailureHook | None,
    recorder: Recorder | None,
) -> aiohttp.ClientResponse:
    """Attempt 1 costs what a bare aiohttp call costs: the policy, the retry bookkeeping and the redacted
    destination are built only after a failure."""
    # aiohttp's UploadTracker: to honour ``_resend_after_disconnect=False``, or to report
    # ``gym.http.body_uploaded`` precisely for a request with a body while telemetry is on.
    track_upload = _UploadTracker is not None and (
        not retry_args[3] or (recorder is not None and kwargs.get("data") is not None)
    )
    # Redirects are followed here, hop by hop, so trace context and session headers go only where the
    # propagation rule allows (aiohttp would forward them to any Location).
    follow_redirects_ = kwargs.pop("allow_redirects", True)
    max_redirects = kwargs.pop("max_redirects", DEFAULT_MAX_REDIRECTS)
    kwargs["allow_redirects"] = False
    start = _perf_counter()
    attempt = 0
    retry: RetryTracker | None = None
    policy: Policy | None = None
    tracker: Any = None
    while True:
        attempt += 1
        inflight.hop_attempt(url, attempt)  # the in-flight table: hop in progress, attempt number
        if recorder is None:
            session = pool.plain
        else:
            recorder.attempts = attempt
            session = pool.for_attempt()
        if track_upload:
            tracker = kwargs["upload_tracker"] = _UploadTracker()
        t0 = _perf_counter() if recorder is not None else start
        try:
            response = await session.request(method, url, **kwargs)
            if follow_redirects_ and response.status in REDIRECT_STATUSES:
                response = await follow_redirects(session, method, url, kwargs, response, max_redirects)
            if read_body and response.status < 400:
                try:
                    await response.read()
                except BaseException:
                    response.close()
                    raise
        except Exception as exc:
            err: Exception = response_head_error(exc, method, url) if is_response_head_error(exc) else exc
        else:
            if recorder is not None:
                recorder.attempt_ok(response, t0)
            if retry is not None:
                retry.attempts = attempt
                retry.log_end("recovered", _perf_counter() - start)
            return response

        if retry is None or policy is None:
            retry = RetryTracker(method, redact_url(str(url)))
            policy = policy_for(retry_args)
        retry.attempts = attempt
        failure = classify_failure(err)
        uploaded = await _body_uploaded(failure, tracker)
        elapsed = _perf_counter() - start
        decision = retry.decide(failure, uploaded, elapsed, policy)
        if recorder is not None:
            recorder.attempt_failed(err, t0, attempt, failure, decision.backoff_s, uploaded)
        if hook is not None and failure is not None:
            await _call_hook(
                hook,
                TransportFailure(
                    error=err,
                    attempt=attempt,
                    reason=failure.reason,
                    body_uploaded=uploaded,
                    will_retry=decision.retry,
                    backoff_s=decision.backoff_s,
                    elapsed_s=elapsed,
                    destination=retry.destination,
                ),
            )
        if not decision.retry:
            if decision.exhausted_by is not None and attempt > 1:
                exhausted = retry.exhausted_error(decision, err, elapsed)
                retry.log_end("gave_up", elapsed, limit=decision.exhausted_by)
                raise exhausted from err
            retry.log_end("gave_up", elapsed, error=type(err).__qualname__)
            raise err
        assert failure is not None
        retry.log_retry(err, failure.reason, decision.backoff_s, elapsed)
        if recorder is not None:
            recorder.retried(failure.reason)
        del err
        await asyncio.sleep(decision.backoff_s)
