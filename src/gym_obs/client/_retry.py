"""Retry policy of ``request()``: which failures are retried, how often and how long.

Every retry path ends: connection-level failures by ``_max_connection_retries`` or the elapsed budget
(``global_aiohttp_max_retry_seconds``), other errors after ``MAX_NUM_TRIES`` attempts on external calls or
the budget on internal ones, and ``_max_num_tries`` caps them all. Retries are connection-level only: an
HTTP reply, whatever its status, is returned to the caller and never re-sent.

Pure decisions only: no I/O, no logging, no module state. The policy is built from the request's
options and the pool config it is given (``Policy.from_options``); the attempt loop (``_send``) does the
sleeping, logging and telling.
"""

from __future__ import annotations

import asyncio
import errno
import random
from collections import Counter
from dataclasses import dataclass
from typing import Final, Literal

import aiohttp

from gym_obs.client._options import RequestOptions
from gym_obs.config import GlobalAIOHTTPAsyncClientConfig
from gym_obs.telemetry import names

__all__ = [
    "MAX_NUM_TRIES",
    "MIN_RETRY_DELAY_S",
    "Classification",
    "Decision",
    "Policy",
    "RetriesExhaustedError",
    "RetryTracker",
    "backoff_seconds",
    "classify_failure",
    "transport_failure_kind",
]

MAX_NUM_TRIES: Final = 3
"""Attempts for generic (non connection-level) errors on external calls. Not meant to be raised: a server
that needs more is a server to fix."""

MIN_RETRY_DELAY_S: Final = 0.001
"""The shortest wait before any re-send (the config's smallest backoff base): a floor under the jitter."""

Category = Literal["connect", "dropped", "other"]
"""``connect``: no connection was made, re-sending is always safe. ``dropped``: an established connection
broke. ``other``: anything else worth another try (read timeouts, payload errors)."""


@dataclass(frozen=True, slots=True)
class Classification:
    """What kind of failure an attempt's exception is, for the retry decision and the telemetry."""

    reason: str  # one of names.RETRY_REASONS
    category: Category


_CONNECT_REFUSED: Final = Classification(names.RETRY_REASON_CONNECTION_REFUSED, "connect")
_CONNECT_OS: Final = Classification(names.RETRY_REASON_CLIENT_OS_ERROR, "connect")
_CONNECT_TIMEOUT: Final = Classification(names.RETRY_REASON_TIMEOUT, "connect")
_DROPPED_DISCONNECT: Final = Classification(names.RETRY_REASON_SERVER_DISCONNECTED, "dropped")
_DROPPED_OS: Final = Classification(names.RETRY_REASON_CLIENT_OS_ERROR, "dropped")
_OTHER_TIMEOUT: Final = Classification(names.RETRY_REASON_TIMEOUT, "other")
_OTHER: Final = Classification(names.RETRY_REASON_OTHER, "other")

# Failures that another attempt cannot fix: certificates, fingerprints, bad URLs, HTTP-level errors.
_NEVER_RETRIED: Final = (
    aiohttp.ClientSSLError,
    aiohttp.ServerFingerprintMismatch,
    aiohttp.InvalidURL,
    aiohttp.NonHttpUrlClientError,
    aiohttp.ClientResponseError,
)


def classify_failure(err: BaseException) -> Classification | None:
    """Map an attempt's exception to a retry reason and category; None means never retry it (it is a
    programming or configuration error, or an HTTP-level error, that another attempt cannot fix)."""
    if isinstance(err, _NEVER_RETRIED):
        return None
    if isinstance(err, aiohttp.ConnectionTimeoutError):
        return _CONNECT_TIMEOUT
    if isinstance(err, aiohttp.ClientConnectorError):
        os_error = err.os_error
        if isinstance(os_error, ConnectionRefusedError) or os_error.errno == errno.ECONNREFUSED:
            return _CONNECT_REFUSED
        return _CONNECT_OS
    if isinstance(err, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError)):
        return _DROPPED_DISCONNECT
    if isinstance(err, (asyncio.TimeoutError, TimeoutError)):
        return _OTHER_TIMEOUT
    if isinstance(err, aiohttp.ClientConnectionError):
        # ClientOSError, ClientConnectionResetError, "Connection closed" while reading.
        return _DROPPED_OS if isinstance(err, OSError) else _DROPPED_DISCONNECT
    if isinstance(err, aiohttp.ClientError):
        return _OTHER
    if isinstance(err, OSError):
        return _DROPPED_OS
    return None


def transport_failure_kind(reason: str, err: BaseException | None = None) -> str:
    """The failure-vocabulary kind (``gym_obs.failures.kinds``) for a transport failure, for callers that
    turn a recovered attempt into a failure event (see ``_on_transport_failure``)."""
    os_errno = getattr(err, "errno", None)
    if os_errno in (errno.EMFILE, errno.ENFILE, errno.EADDRNOTAVAIL, errno.ENOBUFS):
        return "transport_local_resource"
    if reason == names.RETRY_REASON_CONNECTION_REFUSED:
        return "transport_unreachable"
    if reason == names.RETRY_REASON_TIMEOUT:
        return "transport_timeout"
    if isinstance(err, aiohttp.ClientConnectorError):
        return "transport_unreachable"
    return "transport_peer_drop"


def backoff_seconds(retry: int, base: float, cap: float, rand: float | None = None) -> float:
    """Exponential backoff with full jitter: uniform in ``[0, min(cap, base * 2**(retry - 1))]``.

    Full jitter spreads a thundering herd of clients that all lost the same server at the same moment.
    """
    ceiling = min(cap, base * (2.0 ** min(retry - 1, 62)))
    return ceiling * (random.random() if rand is None else rand)


class RetriesExhaustedError(aiohttp.ClientError):
    """A request's retries ran out (attempt limit or time budget). The last attempt's error is chained
    as ``__cause__``; the message says how many attempts over how long."""

    def __init__(
        self,
        method: str,
        destination: str,
        attempts: int,
        elapsed_s: float,
        limit: str,
        last_error_type: str,
        reasons: dict[str, int] | None = None,
    ) -> None:
        self.method = method
        self.destination = destination
        self.attempts = attempts
        self.elapsed_s = elapsed_s
        self.limit = limit
        self.last_error_type = last_error_type
        self.reasons = dict(reasons or {})
        super().__init__(method, destination, attempts, elapsed_s, limit, last_error_type, self.reasons)

    def __str__(self) -> str:
        reasons = ", ".join(f"{k}={v}" for k, v in sorted(self.reasons.items())) or "none"
        return (
            f"{self.method} {self.destination} failed after {self.attempts} attempts over "
            f"{self.elapsed_s:.2f}s ({self.limit}); last error: {self.last_error_type}; "
            f"failed attempts by reason: {reasons}"
        )


@dataclass(slots=True)
class Policy:
    """The retry knobs of one ``request()`` call: its options resolved against the pool config."""

    internal: bool
    max_connection_retries: int | None
    max_num_tries: int | None
    resend_after_disconnect: bool
    retry_other_errors: bool
    budget_s: float
    backoff_base_s: float
    backoff_cap_s: float

    @classmethod
    def from_options(cls, options: RequestOptions, cfg: GlobalAIOHTTPAsyncClientConfig) -> Policy:
        """The policy of one request: its options plus the pool config's budget and backoff."""
        return cls(
            internal=options.internal,
            max_connection_retries=options.max_connection_retries,
            max_num_tries=options.max_num_tries,
            resend_after_disconnect=options.resend_after_disconnect,
            retry_other_errors=options.retry_other_errors,
            budget_s=cfg.global_aiohttp_max_retry_seconds,
            backoff_base_s=cfg.global_aiohttp_retry_backoff_base_seconds,
            backoff_cap_s=cfg.global_aiohttp_retry_backoff_cap_seconds,
        )




@dataclass(slots=True)
class Decision:
    """Re-send after ``backoff_s``, or stop (``exhausted_by`` names the limit that stopped it)."""

    retry: bool
    backoff_s: float = 0.0
    exhausted_by: str | None = None  # set when a limit (not the error's nature) stopped the retries


_NO_RETRY: Final = Decision(retry=False)


class RetryTracker:
    """Per-request retry bookkeeping: attempt and retry counts, failures by reason, the decisions."""

    __slots__ = (
        "_conn_retries", "_other_failures", "attempts", "destination", "method", "reasons", "retries"
    )

    def __init__(self, method: str, destination: str) -> None:
        self.method = method
        self.destination = destination
        self.attempts = 0
        self.retries = 0
        self._conn_retries = 0
        self._other_failures = 0
        self.reasons: Counter[str] = Counter()

    def decide(
        self, failure: Classification | None, uploaded: bool, elapsed_s: float, policy: Policy
    ) -> Decision:
        """Whether to re-send after this attempt's failure, and after how long."""
        if failure is None:
            return _NO_RETRY
        self.reasons[failure.reason] += 1
        if failure.category != "connect" and uploaded and not policy.resend_after_disconnect:
            return _NO_RETRY  # the server may have acted on the request: never replay it
        if failure.category == "other":
            if not policy.retry_other_errors:
                return _NO_RETRY
            self._other_failures += 1
            if not policy.internal and self._other_failures >= MAX_NUM_TRIES:
                return Decision(False, exhausted_by=f"{MAX_NUM_TRIES} tries for errors on external calls")
        else:
            self._conn_retries += 1
            limit = policy.max_connection_retries
            if limit is not None and self._conn_retries > limit:
                return Decision(False, exhausted_by=f"_max_connection_retries={limit}")
        if policy.max_num_tries is not None and self.attempts >= policy.max_num_tries:
            return Decision(False, exhausted_by=f"_max_num_tries={policy.max_num_tries}")
        remaining = policy.budget_s - elapsed_s
        if remaining <= 0:
            return Decision(False, exhausted_by=f"retry budget {policy.budget_s:g}s")
        # The last wait is cut to what is left of the budget, so the final attempt starts inside it.
        # Full jitter can draw 0; the floor keeps any policy (even one built without the config's checks)
        # from turning a refused port into a connect storm.
        self.retries += 1
        backoff = backoff_seconds(self.retries, policy.backoff_base_s, policy.backoff_cap_s)
        return Decision(True, min(max(backoff, MIN_RETRY_DELAY_S), remaining))

    def exhausted_error(
        self, decision: Decision, err: BaseException, elapsed_s: float
    ) -> RetriesExhaustedError:
        return RetriesExhaustedError(
            self.method,
            self.destination,
            self.attempts,
            elapsed_s,
            decision.exhausted_by or "limit",
            type(err).__qualname__,
            dict(self.reasons),
        )
