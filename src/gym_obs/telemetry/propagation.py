"""Rollout context and trace context across hops: path segments, headers and the propagation allow-list.

Some clients cannot set headers (a third-party SDK given only a base URL), so the rollout id and the W3C
``traceparent`` can also travel as leading path segments: ``/ng-rollout/<id>`` and
``/ng-trace/<traceparent>``. Servers strip them before routing. Trace context is sent only to gym servers
(``internal=True``) and to hosts on an explicit allow-list: a trace id must never leak to a third party.

Clients gym_obs does not own (the OpenAI SDK and others on httpx) get the segments from
:func:`with_rollout_prefix` or the httpx request hooks :func:`rollout_prefix_hook` /
:func:`async_rollout_prefix_hook`; httpx itself is never imported here (it stays an optional dependency).
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Iterable, Iterator, MutableMapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Final, NamedTuple
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from opentelemetry import baggage, propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gym_obs.telemetry import names
from gym_obs.telemetry._state import STATE

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    import httpx

__all__ = [
    "ROLLOUT_ID",
    "ParsedPath",
    "apply_rollout_prefix",
    "async_rollout_prefix_hook",
    "context_from_traceparent",
    "current_rollout_id",
    "format_traceparent",
    "inject_trace_headers",
    "parse_path_segments",
    "parse_propagation_targets",
    "rollout_context",
    "rollout_path_prefix",
    "rollout_prefix_hook",
    "should_propagate",
    "trace_context_path_segment",
    "w3c_default_propagator",
    "with_rollout_prefix",
]

ROLLOUT_ID: Final[contextvars.ContextVar[str | None]] = contextvars.ContextVar(
    "gym_obs_rollout_id", default=None
)
"""The rollout the current task works for. Context variables follow ``asyncio`` tasks and
``asyncio.to_thread``, but not work submitted to a plain thread pool."""

_TRACEPARENT_RE: Final = re.compile(names.TRACEPARENT_PATTERN)
_ROLLOUT_PREFIX: Final = f"/{names.ROLLOUT_PATH_SEGMENT}/"
_TRACE_PREFIX: Final = f"/{names.TRACE_PATH_SEGMENT}/"
_TOKEN_CAPTURE_SEGMENT: Final = f"/{names.TOKEN_CAPTURE_PATH_SEGMENT}"
_MAX_ROLLOUT_ID_CHARS: Final = 256
_DEFAULT_PORTS: Final = {"http": 80, "https": 443, "ws": 80, "wss": 443}


# --- rollout context -------------------------------------------------------------------------------------


def current_rollout_id() -> str | None:
    """The rollout id of the current context, if any."""
    return ROLLOUT_ID.get()


@contextmanager
def rollout_context(rollout_id: str | None) -> Iterator[str | None]:
    """Make ``rollout_id`` current for the block (``None`` clears it)."""
    token = ROLLOUT_ID.set(rollout_id)
    try:
        yield rollout_id
    finally:
        ROLLOUT_ID.reset(token)


# --- path segments ---------------------------------------------------------------------------------------


class ParsedPath(NamedTuple):
    """A request path with the gym segments removed, and what they carried."""

    path: str
    traceparent: str | None = None
    rollout_id: str | None = None
    token_capture: bool = False


_FLAGS_HEX: Final = tuple(f"{flags:02x}" for flags in range(256))


def format_traceparent(trace_id: int, span_id: int, trace_flags: int) -> str:
    """The W3C ``traceparent`` value for a span context (every gym hop formats one: ``bytes.hex`` is about
    twice as fast as zero-padded ``format`` for 128 bits; ids out of range are formatted as they come)."""
    try:
        return "-".join(("00", trace_id.to_bytes(16, "big").hex(), span_id.to_bytes(8, "big").hex(),
                         _FLAGS_HEX[trace_flags]))
    except (OverflowError, IndexError):
        return f"00-{trace_id:032x}-{span_id:016x}-{trace_flags:02x}"


def trace_context_path_segment() -> str:
    """``/ng-trace/<traceparent>`` of the current span; ``""`` when traces are off or no span is current."""
    if not (STATE.enabled and STATE.traces_enabled):
        return ""
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return ""
    return _TRACE_PREFIX + format_traceparent(ctx.trace_id, ctx.span_id, ctx.trace_flags)


def rollout_path_prefix(rollout_id: str, token_capture: bool = False) -> str:
    """``/ng-rollout/<id>`` (id percent-encoded), plus ``/ng-token-capture`` when the model server should
    capture token ids for this rollout."""
    prefix = _ROLLOUT_PREFIX + quote(rollout_id, safe="")
    return prefix + _TOKEN_CAPTURE_SEGMENT if token_capture else prefix


def apply_rollout_prefix(
    base_url: str, rollout_id: str | None, token_capture: bool = False, trace_context: bool = True
) -> str:
    """Insert the rollout prefix (and, with ``trace_context``, the current trace segment) right after the
    authority of ``base_url``: ``http://h:1/v1`` becomes ``http://h:1/ng-rollout/<id>/ng-trace/<tp>/v1``.

    Segments the URL already carries are kept, so applying twice changes nothing. A URL that cannot be
    parsed is returned unchanged.
    """
    try:
        parts = urlsplit(base_url)
    except ValueError:
        return base_url
    parsed = parse_path_segments(parts.path)
    rid = parsed.rollout_id if parsed.rollout_id is not None else rollout_id
    capture = parsed.token_capture or token_capture
    prefix = rollout_path_prefix(rid, capture) if rid else ""
    if parsed.traceparent is not None:
        prefix += _TRACE_PREFIX + parsed.traceparent
    elif trace_context:
        prefix += trace_context_path_segment()
    if not prefix:
        return base_url
    rest = parsed.path if parsed.path != "/" or parts.path.endswith("/") else ""
    return urlunsplit((parts.scheme, parts.netloc, prefix + rest, parts.query, parts.fragment))


def parse_path_segments(path: str) -> ParsedPath:
    """Strip leading ``/ng-rollout/<id>[/ng-token-capture]`` and ``/ng-trace/<traceparent>`` (either order).

    A segment with an invalid value is still stripped (routing must not depend on it), but its value is
    dropped: an all-zero or malformed traceparent, or a rollout id that is too long or has control chars.
    """
    traceparent: str | None = None
    rollout_id: str | None = None
    token_capture = False
    seen_trace = seen_rollout = False
    while True:
        if not seen_rollout and path.startswith(_ROLLOUT_PREFIX):
            seen_rollout = True
            value, path = _split_segment(path, len(_ROLLOUT_PREFIX))
            rollout_id = _valid_rollout_id(unquote(value))
            if path == _TOKEN_CAPTURE_SEGMENT or path.startswith(_TOKEN_CAPTURE_SEGMENT + "/"):
                token_capture = True
                path = path[len(_TOKEN_CAPTURE_SEGMENT) :]
        elif not seen_trace and path.startswith(_TRACE_PREFIX):
            seen_trace = True
            value, path = _split_segment(path, len(_TRACE_PREFIX))
            traceparent = value if _valid_traceparent(value) else None
        else:
            break
    return ParsedPath(path or "/", traceparent, rollout_id, token_capture)


def _split_segment(path: str, start: int) -> tuple[str, str]:
    end = path.find("/", start)
    if end == -1:
        return path[start:], ""
    return path[start:end], path[end:]


def _valid_traceparent(value: str) -> bool:
    if _TRACEPARENT_RE.fullmatch(value) is None:
        return False
    _, trace_id, span_id, _ = value.split("-")
    return trace_id != "0" * 32 and span_id != "0" * 16


def _valid_rollout_id(value: str) -> str | None:
    if not value or len(value) > _MAX_ROLLOUT_ID_CHARS or not value.isprintable():
        return None
    return value


# --- clients gym_obs does not own: prefix matching URLs, httpx request hooks ----------------------------


class _BaseUrl(NamedTuple):
    scheme: str
    host: str
    port: int
    segments: tuple[str, ...]
    marked: bool  # the base already carries a gym segment: URLs under it are prefixed already


def _effective_port(scheme: str, port: int | None) -> int | None:
    return port if port is not None else _DEFAULT_PORTS.get(scheme)


def _path_segments(path: str) -> tuple[str, ...]:
    """``/a/b/`` -> ``("a", "b", "")``; ``""`` and ``"/"`` -> ``()``. Raw (percent-encoded) segments."""
    if not path or path == "/":
        return ()
    return tuple(path[1:].split("/") if path.startswith("/") else path.split("/"))


def _parse_base_url(url: str) -> _BaseUrl | None:
    try:
        parts = urlsplit(url.strip())
        scheme = parts.scheme.lower()
        host = (parts.hostname or "").lower()
        port = _effective_port(scheme, parts.port)
    except ValueError:
        return None
    if not host or port is None:
        return None
    segments = _path_segments(parts.path.rstrip("/"))
    gym = {names.ROLLOUT_PATH_SEGMENT, names.TRACE_PATH_SEGMENT}
    return _BaseUrl(scheme, host, port, segments, any(seg in gym for seg in segments))


class _RolloutPrefixer:
    """Matches URLs against parsed base URLs and inserts the gym segments after the longest match."""

    __slots__ = ("_bases",)

    def __init__(self, base_urls: str | Iterable[str]) -> None:
        items = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        parsed = (_parse_base_url(str(item)) for item in items)
        # Longest path first: the most specific base wins when several share an origin.
        self._bases = sorted((b for b in parsed if b is not None), key=lambda b: -len(b.segments))

    def new_path(self, scheme: str, host: str, port: int | None, path: str) -> str | None:
        """The path with the segments inserted, or ``None`` to leave the URL alone."""
        rollout_id = ROLLOUT_ID.get()
        if rollout_id is None:
            return None
        scheme = scheme.lower()
        host = host.lower()
        effective = _effective_port(scheme, port)
        segments = _path_segments(path)
        for base in self._bases:
            if (base.scheme, base.host, base.port) != (scheme, host, effective):
                continue
            count = len(base.segments)
            if segments[:count] != base.segments:
                continue
            if base.marked:
                return None
            consumed = sum(len(seg) + 1 for seg in base.segments)
            head, rest = path[:consumed], path[consumed:]
            if rest.startswith((_ROLLOUT_PREFIX, _TRACE_PREFIX)) or rest in (
                _ROLLOUT_PREFIX[:-1],
                _TRACE_PREFIX[:-1],
            ):
                return None  # already prefixed
            return head + rollout_path_prefix(rollout_id) + trace_context_path_segment() + rest
        return None

    def url(self, url: str) -> str:
        if ROLLOUT_ID.get() is None:
            return url
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            return url
        path = self.new_path(parts.scheme, parts.hostname or "", port, parts.path)
        if path is None:
            return url
        return urlunsplit((parts.scheme, parts.netloc, path, parts.query, parts.fragment))


def with_rollout_prefix(url: str, base_urls: str | Iterable[str]) -> str:
    """``url`` with ``/ng-rollout/<current rollout>`` inserted right after the base URL it falls under.

    For clients gym_obs does not own, given a gym server's URL: ``with_rollout_prefix(
    "http://h:8000/v1/chat/completions", ["http://h:8000"])`` inside rollout ``r1`` gives
    ``http://h:8000/ng-rollout/r1/v1/chat/completions``; while traces export, the current span's
    ``/ng-trace/<traceparent>`` follows, so the server joins the caller's trace. A base matches when
    scheme, host (case-insensitive) and effective port (80/443 when absent) are equal and its path is a
    whole-segment prefix of the URL's (``/v1`` matches ``/v1/x``, never ``/v10``); the longest match wins.
    Left alone: URLs matching no base, URLs that already carry the segments, and calls outside a rollout.

    The rollout is read from a context variable, which follows ``asyncio`` tasks and
    ``asyncio.to_thread`` but not work handed to a ``ThreadPoolExecutor`` (wrap that work in
    ``contextvars.copy_context().run``).
    """
    return _RolloutPrefixer(base_urls).url(url)


def _prefix_httpx_request(prefixer: _RolloutPrefixer, request: httpx.Request) -> None:
    url = request.url
    raw = url.raw_path.decode("ascii")
    path, sep, query = raw.partition("?")
    new_path = prefixer.new_path(url.scheme, url.host, url.port, path)
    if new_path is not None:
        request.url = url.copy_with(raw_path=(new_path + sep + query).encode("ascii"))


def rollout_prefix_hook(base_urls: str | Iterable[str]) -> Callable[[httpx.Request], None]:
    """An httpx request event hook applying :func:`with_rollout_prefix` to every request it sees.

    ``httpx.Client(event_hooks={"request": [rollout_prefix_hook([model_url])]})``; the OpenAI SDK takes
    such a client through ``http_client=``. The hook rewrites ``request.url`` in place. Hooks run in the
    calling thread's context: see :func:`with_rollout_prefix` for the context-variable caveat.
    """
    prefixer = _RolloutPrefixer(base_urls)

    def hook(request: httpx.Request) -> None:
        if ROLLOUT_ID.get() is not None:
            _prefix_httpx_request(prefixer, request)

    return hook


def async_rollout_prefix_hook(
    base_urls: str | Iterable[str],
) -> Callable[[httpx.Request], Awaitable[None]]:
    """The ``httpx.AsyncClient`` flavour of :func:`rollout_prefix_hook` (async clients need async hooks)."""
    prefixer = _RolloutPrefixer(base_urls)

    async def hook(request: httpx.Request) -> None:
        if ROLLOUT_ID.get() is not None:
            _prefix_httpx_request(prefixer, request)

    return hook


# --- propagation allow-list and headers ------------------------------------------------------------------


def parse_propagation_targets(entries: str | Iterable[str] | None) -> frozenset[str]:
    """Normalise ``host[:port]`` entries (a comma-separated string or a list) for :func:`should_propagate`.

    Hosts are lowercased; IPv6 hosts may be bracketed (``[::1]:8080``). Empty entries are ignored.
    """
    if entries is None:
        return frozenset()
    items = entries.split(",") if isinstance(entries, str) else list(entries)
    result: set[str] = set()
    for raw in items:
        entry = str(raw).strip().lower()
        if not entry:
            continue
        host, port = _split_host_port(entry)
        if host:
            result.add(_target_key(host, port))
    return frozenset(result)


def _split_host_port(entry: str) -> tuple[str, int | None]:
    if entry.startswith("["):
        end = entry.find("]")
        host = entry[1:end] if end != -1 else entry[1:]
        rest = entry[end + 1 :] if end != -1 else ""
        port_text = rest[1:] if rest.startswith(":") else ""
    elif entry.count(":") == 1:
        host, port_text = entry.split(":")
    else:  # bare host, or a bare IPv6 address
        host, port_text = entry, ""
    port = int(port_text) if port_text.isdigit() else None
    return host, port


def _target_key(host: str, port: int | None) -> str:
    if port is None:
        return host
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def should_propagate(url: str, *, internal: bool = False) -> bool:
    """Whether trace context may be sent with a request to ``url``.

    Always for gym servers (``internal=True``); otherwise only when the URL's host, or host and port, is on
    the allow-list (``STATE.propagation_targets``; an entry without a port matches any port).
    """
    if internal:
        return True
    targets = STATE.propagation_targets
    if not targets:
        return False
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        port = parts.port if parts.port is not None else _DEFAULT_PORTS.get(parts.scheme.lower())
    except ValueError:
        return False
    if not host:
        return False
    return host in targets or (port is not None and _target_key(host, port) in targets)


_W3C_TYPES: Final = (TraceContextTextMapPropagator, W3CBaggagePropagator)
# The global propagator last looked at, and whether it is the W3C default (see _is_w3c_default).
_checked: tuple[TextMapPropagator | None, bool] = (None, False)


def _is_w3c_default(textmap: TextMapPropagator) -> bool:
    """Whether ``textmap`` is W3C trace context, alone or with W3C baggage (the SDK's default,
    ``OTEL_PROPAGATORS=tracecontext,baggage``): then the headers are written here, as it would write them.

    A composite's parts are only in its private ``_propagators`` (no public accessor); a shape that does
    not match is "not the default", which only means the propagator itself injects.
    """
    parts = getattr(textmap, "_propagators", None) if type(textmap) is CompositePropagator else [textmap]
    if not isinstance(parts, list) or not parts:
        return False
    kinds = [type(part) for part in parts]
    return TraceContextTextMapPropagator in kinds and all(kind in _W3C_TYPES for kind in kinds)


def w3c_default_propagator() -> bool:
    """Whether the global propagator is the W3C default (:func:`_is_w3c_default`; checked once per
    propagator object): then a ``traceparent`` is written and read here, as it would write and read it."""
    global _checked
    textmap = propagate.get_global_textmap()
    checked, w3c = _checked
    if textmap is not checked:
        w3c = _is_w3c_default(textmap)
        _checked = (textmap, w3c)
    return w3c


# TraceContextTextMapPropagator's header pattern and rules (context_from_traceparent), not the stricter
# rule of the /ng-trace path segment (_TRACEPARENT_RE).
_TRACEPARENT_HEADER_RE: Final = re.compile(
    r"^[ \t]*([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?[ \t]*$"
)
_ZERO_TRACE_ID: Final = "0" * 32
_ZERO_SPAN_ID: Final = "0" * 16
_EMPTY_CONTEXT: Final = Context()


def context_from_traceparent(value: str) -> Context:
    """The context ``TraceContextTextMapPropagator`` extracts from a carrier holding only ``value`` as its
    ``traceparent`` (same pattern, same rules; an empty context for an invalid one), without its per-call
    pattern look-up: for a server whose :func:`w3c_default_propagator` holds."""
    match = _TRACEPARENT_HEADER_RE.match(value)
    if match is None:
        return _EMPTY_CONTEXT
    version, trace_id, span_id, flags, rest = match.groups()
    if trace_id == _ZERO_TRACE_ID or span_id == _ZERO_SPAN_ID or version == "ff":
        return _EMPTY_CONTEXT
    if version == "00" and rest:
        return _EMPTY_CONTEXT
    remote = trace.SpanContext(int(trace_id, 16), int(span_id, 16), True, trace.TraceFlags(int(flags, 16)))
    return trace.set_span_in_context(trace.NonRecordingSpan(remote), _EMPTY_CONTEXT)


def inject_trace_headers(headers: MutableMapping[str, str], context: Context | None = None) -> None:
    """Inject the trace context of ``context`` (default: the current one) into ``headers`` with the global
    propagator: ``traceparent`` (and ``tracestate``, ``baggage`` when there are any).

    A no-op when telemetry is off. Call it inside the request's CLIENT span (or with the context holding
    it) and only after :func:`should_propagate` said yes. With the W3C default propagator the headers are
    formatted here, byte for byte what the propagator writes, without its generic path (it runs on every
    gym hop); any other propagator, and any baggage, go through the propagator itself.
    """
    if not (STATE.enabled and STATE.traces_enabled):
        return
    if not w3c_default_propagator() or baggage.get_all(context):
        propagate.get_global_textmap().inject(headers, context)
        return
    span_context = trace.get_current_span(context).get_span_context()
    if span_context == trace.INVALID_SPAN_CONTEXT:
        return
    headers[names.TRACEPARENT_HEADER] = format_traceparent(
        span_context.trace_id, span_context.span_id, span_context.trace_flags
    )
    if span_context.trace_state:
        headers[names.TRACESTATE_HEADER] = span_context.trace_state.to_header()
