"""Retry classification, backoff and the decision rules of request(), without a network."""

from __future__ import annotations

import asyncio
import errno
import pickle

import aiohttp
import pytest
from aiohttp.client_reqrep import ConnectionKey

from gym_obs.client._retry import (
    MAX_NUM_TRIES,
    Policy,
    RetryTracker,
    backoff_seconds,
    classify_failure,
    transport_failure_kind,
)
from gym_obs.telemetry import names

_KEY = ConnectionKey("127.0.0.1", 22001, False, True, None, None, None)


def _policy(**overrides: object) -> Policy:
    values: dict[str, object] = {
        "internal": False,
        "max_connection_retries": None,
        "max_num_tries": None,
        "resend_after_disconnect": True,
        "retry_other_errors": True,
        "budget_s": 60.0,
        "backoff_base_s": 0.0,
        "backoff_cap_s": 0.0,
    }
    values.update(overrides)
    return Policy(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("error", "reason", "category"),
    [
        (aiohttp.ClientConnectorError(_KEY, ConnectionRefusedError(errno.ECONNREFUSED, "refused")),
         names.RETRY_REASON_CONNECTION_REFUSED, "connect"),
        (aiohttp.ClientConnectorError(_KEY, OSError(errno.EHOSTUNREACH, "unreachable")),
         names.RETRY_REASON_CLIENT_OS_ERROR, "connect"),
        (aiohttp.ConnectionTimeoutError("connect"), names.RETRY_REASON_TIMEOUT, "connect"),
        (aiohttp.ServerDisconnectedError(), names.RETRY_REASON_SERVER_DISCONNECTED, "dropped"),
        (aiohttp.ClientPayloadError("cut"), names.RETRY_REASON_SERVER_DISCONNECTED, "dropped"),
        (aiohttp.ClientOSError(errno.ECONNRESET, "reset"), names.RETRY_REASON_CLIENT_OS_ERROR, "dropped"),
        (aiohttp.ClientConnectionResetError("reset"), names.RETRY_REASON_CLIENT_OS_ERROR, "dropped"),
        (aiohttp.ClientConnectionError("closed"), names.RETRY_REASON_SERVER_DISCONNECTED, "dropped"),
        (aiohttp.SocketTimeoutError("read"), names.RETRY_REASON_TIMEOUT, "other"),
        (TimeoutError(), names.RETRY_REASON_TIMEOUT, "other"),
        (aiohttp.ClientError("odd"), names.RETRY_REASON_OTHER, "other"),
    ],
)
def test_classification(error: BaseException, reason: str, category: str) -> None:
    failure = classify_failure(error)
    assert failure is not None
    assert failure.reason in names.RETRY_REASONS
    assert (failure.reason, failure.category) == (reason, category)


@pytest.mark.parametrize(
    "error",
    [
        ValueError("bad argument"),
        TypeError("bad type"),
        RuntimeError("Session is closed"),
        aiohttp.InvalidURL("nope"),
        aiohttp.ClientResponseError(None, (), status=500),  # type: ignore[arg-type]
        asyncio.CancelledError(),
    ],
)
def test_errors_no_retry_can_fix_are_not_retried(error: BaseException) -> None:
    assert classify_failure(error) is None


def test_failure_kinds_match_the_failure_vocabulary() -> None:
    from gym_obs.failures.kinds import FAILURE_KINDS

    cases = {
        transport_failure_kind(names.RETRY_REASON_CONNECTION_REFUSED),
        transport_failure_kind(names.RETRY_REASON_TIMEOUT),
        transport_failure_kind(names.RETRY_REASON_SERVER_DISCONNECTED),
        transport_failure_kind(names.RETRY_REASON_CLIENT_OS_ERROR, OSError(errno.EMFILE, "too many")),
    }
    assert cases == {
        "transport_unreachable", "transport_timeout", "transport_peer_drop", "transport_local_resource"
    }
    assert cases <= FAILURE_KINDS


def test_backoff_is_exponential_with_full_jitter_and_a_cap() -> None:
    assert backoff_seconds(1, 0.1, 5.0, rand=1.0) == pytest.approx(0.1)
    assert backoff_seconds(3, 0.1, 5.0, rand=1.0) == pytest.approx(0.4)
    assert backoff_seconds(30, 0.1, 5.0, rand=1.0) == pytest.approx(5.0)
    assert backoff_seconds(10_000, 0.1, 5.0, rand=1.0) == pytest.approx(5.0)
    assert backoff_seconds(3, 0.1, 5.0, rand=0.0) == 0.0
    samples = [backoff_seconds(4, 0.1, 5.0) for _ in range(2000)]
    assert all(0.0 <= s <= 0.8 for s in samples)
    assert min(samples) < 0.1 and max(samples) > 0.7  # spread over the whole interval


def _run(tracker: RetryTracker, error: BaseException, *, uploaded: bool = True,
         elapsed: float = 0.0, **policy: object) -> bool:
    tracker.attempts += 1
    decision = tracker.decide(classify_failure(error), uploaded, elapsed, _policy(**policy))
    return decision.retry


def test_generic_errors_get_max_num_tries_on_external_calls() -> None:
    tracker = RetryTracker("GET", "http://x/")
    outcomes = [_run(tracker, aiohttp.SocketTimeoutError()) for _ in range(MAX_NUM_TRIES)]
    assert outcomes == [True] * (MAX_NUM_TRIES - 1) + [False]


def test_generic_errors_on_internal_calls_are_bounded_by_the_budget() -> None:
    tracker = RetryTracker("GET", "http://x/")
    assert all(_run(tracker, aiohttp.SocketTimeoutError(), internal=True) for _ in range(20))
    assert not _run(tracker, aiohttp.SocketTimeoutError(), internal=True, elapsed=61.0)


def test_connection_retries_are_bounded_by_count_and_by_budget() -> None:
    tracker = RetryTracker("GET", "http://x/")
    outcomes = [_run(tracker, aiohttp.ServerDisconnectedError(), max_connection_retries=2) for _ in range(3)]
    assert outcomes == [True, True, False]
    tracker = RetryTracker("GET", "http://x/")
    assert all(_run(tracker, aiohttp.ServerDisconnectedError()) for _ in range(50))
    assert not _run(tracker, aiohttp.ServerDisconnectedError(), elapsed=60.5)


def test_the_last_backoff_is_cut_to_the_budget_left() -> None:
    policy = _policy(budget_s=1.0, backoff_base_s=10.0, backoff_cap_s=10.0)
    disconnected = classify_failure(aiohttp.ServerDisconnectedError())
    tracker = RetryTracker("GET", "http://x/")
    tracker.attempts = 1
    decision = tracker.decide(disconnected, True, 0.95, policy)
    assert decision.retry and decision.backoff_s <= 0.05 + 1e-9
    tracker.attempts = 2
    decision = tracker.decide(disconnected, True, 1.0, policy)
    assert not decision.retry and decision.exhausted_by == "retry budget 1s"


def test_max_num_tries_caps_every_path() -> None:
    for error in (aiohttp.ServerDisconnectedError(), aiohttp.SocketTimeoutError(),
                  aiohttp.ClientConnectorError(_KEY, ConnectionRefusedError(errno.ECONNREFUSED, "x"))):
        tracker = RetryTracker("GET", "http://x/")
        outcomes = [_run(tracker, error, internal=True, max_num_tries=2) for _ in range(2)]
        assert outcomes == [True, False]


def test_resend_after_disconnect_false_never_replays_an_uploaded_request() -> None:
    refused = aiohttp.ClientConnectorError(_KEY, ConnectionRefusedError(errno.ECONNREFUSED, "x"))
    tracker = RetryTracker("POST", "http://x/")
    assert not _run(tracker, aiohttp.ServerDisconnectedError(), uploaded=True, resend_after_disconnect=False)
    assert not _run(tracker, aiohttp.SocketTimeoutError(), uploaded=True, resend_after_disconnect=False)
    # Not fully uploaded: the server cannot have acted on it.
    assert _run(tracker, aiohttp.ServerDisconnectedError(), uploaded=False, resend_after_disconnect=False)
    # Never connected: always safe.
    assert _run(tracker, refused, uploaded=False, resend_after_disconnect=False)


def test_retry_other_errors_false_resends_only_dropped_or_refused() -> None:
    refused = aiohttp.ClientConnectorError(_KEY, ConnectionRefusedError(errno.ECONNREFUSED, "x"))
    tracker = RetryTracker("GET", "http://x/")
    assert not _run(tracker, aiohttp.SocketTimeoutError(), retry_other_errors=False)
    assert not _run(tracker, aiohttp.ClientError("odd"), retry_other_errors=False)
    assert _run(tracker, aiohttp.ServerDisconnectedError(), retry_other_errors=False)
    assert _run(tracker, refused, retry_other_errors=False)


def test_exhaustion_error_says_attempts_and_time_and_pickles() -> None:
    tracker = RetryTracker("POST", "http://127.0.0.1:22001/run")
    _run(tracker, aiohttp.ServerDisconnectedError())
    tracker.attempts += 1
    decision = tracker.decide(classify_failure(aiohttp.ServerDisconnectedError()), True, 0.0,
                              _policy(max_connection_retries=1))
    assert not decision.retry
    error = tracker.exhausted_error(decision, aiohttp.ServerDisconnectedError(), 1.234)
    text = str(error)
    assert "POST http://127.0.0.1:22001/run failed after 2 attempts over 1.23s" in text
    assert "_max_connection_retries=1" in text and "server_disconnected=2" in text
    assert isinstance(error, aiohttp.ClientError)
    clone = pickle.loads(pickle.dumps(error))
    assert str(clone) == text and clone.attempts == 2
