"""RequestOptions: every knob of one ``request()`` call, built once and read by name downstream.

``request()`` validates its arguments and freezes them here; the attempt loop, the retry policy and the
observer read fields of this one object. Adding a request option means adding a field here and reading it
where it is used: no signature between ``request()`` and the attempt loop changes. The hook's argument
(:class:`TransportFailure`) lives here too, because it is part of the ``on_transport_failure`` contract.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

__all__ = [
    "DEFAULT_MAX_REDIRECTS",
    "KNOWN_METHODS",
    "RequestOptions",
    "TransportFailure",
    "TransportFailureHook",
]

DEFAULT_MAX_REDIRECTS: Final = 10  # aiohttp's default

KNOWN_METHODS: Final = frozenset(
    {"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE"}
)
"""The methods semconv names as themselves (``http.request.method``); any other is ``_OTHER``."""


@dataclass(frozen=True, slots=True)
class TransportFailure:
    """One failed attempt, as given to ``request(..., _on_transport_failure=hook)``.

    ``will_retry`` False means this error (or ``RetriesExhaustedError`` chained to it) is about to be
    raised to the caller; True means a later attempt may still recover it (the case a server reports as a
    recovered failure through ``gym_obs.failures.transport.observe_failure``). ``failure_kind`` is the
    failure-vocabulary kind (``gym_obs.failures.kinds``) of this transport failure.
    """

    error: BaseException
    attempt: int
    reason: str
    body_uploaded: bool
    will_retry: bool
    backoff_s: float
    elapsed_s: float
    destination: str  # redacted URL
    failure_kind: str


TransportFailureHook = Callable[[TransportFailure], object]
"""Called with every failed attempt (sync or async); its errors are logged, never raised."""


@dataclass(frozen=True, slots=True)
class RequestOptions:
    """The gym knobs of one logical request (``request()``'s underscore arguments, plus the redirect
    settings taken out of the aiohttp keyword arguments, because ``request()`` follows redirects itself)."""

    internal: bool = False
    """A gym server: trace context always propagates; other errors retry until the time budget."""
    server_name: str | None = None
    """The destination's gym server name (the bounded ``gym.server.name`` label; ``external`` if None)."""
    control: bool = False
    """Use the control pool (health checks, head server) instead of the data pool."""
    max_connection_retries: int | None = None
    max_num_tries: int | None = None
    resend_after_disconnect: bool = True
    retry_other_errors: bool = True
    read_body: bool = False
    """Read a success body inside the attempt loop, so a reset mid-body is retried too."""
    route: str | None = None
    """A route template for the span name (``POST /v1/responses``), never a raw path with ids."""
    on_transport_failure: TransportFailureHook | None = None
    allow_redirects: bool = True
    max_redirects: int = DEFAULT_MAX_REDIRECTS
