"""OTLP protobuf wire bytes written directly from the SDK's span objects, for the OTLP exporters.

Why: the official path (SDK objects -> protobuf message objects -> ``SerializeToString``) costs ~50 µs per
span on the batch processor's thread, which a saturated process pays out of its request budget. Here each
span is written straight to the wire format -- tags, varints, length-delimited submessages, bottom-up --
with the repeated parts cached: the resource and scope of a batch are encoded once, and the ``KeyValue``
of a short string or integer attribute seen before (``http.request.method = POST``) is one dict lookup.

It mirrors ``opentelemetry-exporter-otlp-proto-common``'s ``encode_spans`` field by field and writes the
fields in field-number order, as protobuf's own serializer does, so the bytes are the official encoder's
bytes (``tests/unit/test_otlp_proto.py`` holds it to that). An attribute the official encoder would skip
(an int beyond int64, a string that is not valid UTF-8, an unknown type) is skipped; any other failure
raises, and the exporter falls back to the official encoder.

Spans only: metrics and logs keep the SDK's encoders. A process exports one metrics collection every few
seconds (tens of points, ~2 ms to encode: ``benchmarks/file_sink.py``) against thousands of spans a second
under load, and log records are few.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Final

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link

from gym_obs.telemetry._otlp_json import (
    KIND,
    FragmentCache,
    Unencodable,
    group_spans,
    plain_attributes,
    span_attributes,
    span_events,
    span_links,
)

__all__ = ["ProtoEncoder", "encode_key_values", "varint"]

_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1
_U64: Final = 2**64
_M64: Final = _U64 - 1
_ONE_BYTE: Final = tuple(bytes((n,)) for n in range(128))
_DOUBLE: Final = struct.Struct("<d")
_FIXED64: Final = struct.Struct("<Q")
_BOOL: Final = (b"\x10\x00", b"\x10\x01")  # AnyValue.bool_value (a oneof member: false is written too)
# Span.trace_id (1, 16 bytes) and Span.span_id (2, 8 bytes), tags and lengths included; Link uses the same.
_IDS: Final = struct.Struct(">2sQQ2sQ")
_PARENT: Final = struct.Struct(">2sQ")  # Span.parent_span_id (4)
_TIMES: Final = struct.Struct("<BQBQ")  # Span.start_time_unix_nano (7), end_time_unix_nano (8): fixed64
_FLAGS: Final = struct.Struct("<2sI")  # Span.flags (16, fixed32; the tag is two bytes)
_FLAGS_LOCAL: Final = _FLAGS.pack(b"\x85\x01", 0x100)
_FLAGS_REMOTE: Final = _FLAGS.pack(b"\x85\x01", 0x300)
_LINK_FLAGS_LOCAL: Final = b"\x35" + (0x100).to_bytes(4, "little")  # Link.flags (6)
_LINK_FLAGS_REMOTE: Final = b"\x35" + (0x300).to_bytes(4, "little")
_KIND_FIELD: Final = {kind: bytes((0x30, value)) for kind, value in KIND.items()}  # Span.kind (6)


def varint(value: int) -> bytes:
    """An unsigned base-128 varint (a negative int64 as its 64-bit two's complement, ten bytes)."""
    if 0 <= value < 0x80:
        return _ONE_BYTE[value]
    if value < 0:
        value += _U64
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: tag, length, payload."""
    size = len(payload)
    return tag + (_ONE_BYTE[size] if size < 0x80 else varint(size)) + payload


def _text(tag: bytes, value: str) -> bytes:
    return _field(tag, value.encode())


def _any_value(value: object) -> bytes:
    """An ``AnyValue`` message's bytes, in the official encoder's isinstance order."""
    kind = type(value)
    if kind is str:
        return _str_value(value)  # type: ignore[arg-type]
    if kind is bool:
        return _BOOL[value]  # type: ignore[call-overload]
    if kind is int:
        return _int_value(value)  # type: ignore[arg-type]
    if kind is float:
        return b"\x21" + _DOUBLE.pack(value)
    return _any_value_slow(value)


def _str_value(value: str) -> bytes:
    try:
        return _text(b"\x0a", value)
    except UnicodeEncodeError as exc:  # a lone surrogate: protobuf refuses it too
        raise Unencodable(str(exc)) from None


def _int_value(value: int) -> bytes:
    if _I64_MIN <= value <= _I64_MAX:
        return b"\x18" + varint(value)
    raise Unencodable(f"{value} does not fit an int64")


def _any_value_slow(value: object) -> bytes:
    if value is None:
        return b""
    if isinstance(value, bool):
        return _BOOL[bool(value)]
    if isinstance(value, str):
        return _str_value(str(value))
    if isinstance(value, int):
        return _int_value(int(value))
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    if isinstance(value, Sequence):
        return _field(b"\x2a", b"".join([_field(b"\x0a", _any_value(item)) for item in value]))
    if isinstance(value, Mapping):
        pairs = [_field(b"\x0a", _key_value(str(key), item)) for key, item in value.items()]
        return _field(b"\x32", b"".join(pairs))
    raise Unencodable(f"invalid type {type(value).__name__}")


def _key_value(key: str, value: object) -> bytes:
    """A ``KeyValue`` message's bytes (an empty key is proto3's default: left out)."""
    encoded = _field(b"\x12", _any_value(value))
    return _text(b"\x0a", key) + encoded if key else encoded


def _span_attribute(key: str, value: object) -> bytes:
    return _field(b"\x4a", _key_value(key, value))  # Span.attributes (9)


def encode_key_values(tag: bytes, attributes: object) -> bytes:
    """Repeated ``KeyValue`` fields under ``tag``, uncached; an attribute that cannot be encoded is
    skipped."""
    plain = plain_attributes(attributes)
    if not plain:
        return b""
    out: list[bytes] = []
    for key, value in plain.items():
        try:
            out.append(_field(tag, _key_value(key, value)))
        except Unencodable:
            continue
    return b"".join(out)


class ProtoEncoder:
    """Writes ``ExportTraceServiceRequest`` bytes; one per exporter (it keeps its caches across batches)."""

    def __init__(self) -> None:
        self._span_pairs = FragmentCache(_span_attribute)
        self._resources: dict[int, tuple[Resource, bytes]] = {}
        self._scopes: dict[int, tuple[InstrumentationScope | None, bytes]] = {}

    # -- the parts every batch repeats ---------------------------------------------------------------------

    def resource_field(self, resource: Resource) -> bytes:
        """The ``resource`` field (1) of a ResourceSpans, cached by object (a process has one or two)."""
        cached = self._resources.get(id(resource))
        if cached is not None and cached[0] is resource:
            return cached[1]
        encoded = _field(b"\x0a", encode_key_values(b"\x0a", resource.attributes))
        if len(self._resources) >= 64:
            self._resources.clear()
        self._resources[id(resource)] = (resource, encoded)
        return encoded

    def scope_field(self, scope: InstrumentationScope | None) -> bytes:
        """The ``scope`` field (1) of a ScopeSpans (an empty scope when there is none), cached by object."""
        cached = self._scopes.get(id(scope))
        if cached is not None and cached[0] is scope:
            return cached[1]
        parts: list[bytes] = []
        if scope is not None:
            if scope.name:
                parts.append(_text(b"\x0a", scope.name))
            if scope.version:
                parts.append(_text(b"\x12", scope.version))
            parts.append(encode_key_values(b"\x1a", scope.attributes))
        encoded = _field(b"\x0a", b"".join(parts))
        if len(self._scopes) >= 64:
            self._scopes.clear()
        self._scopes[id(scope)] = (scope, encoded)
        return encoded

    # -- spans ---------------------------------------------------------------------------------------------

    def spans(self, spans: Sequence[ReadableSpan]) -> bytes:
        """One ``ExportTraceServiceRequest``: spans grouped by resource, then scope, in first-seen order."""
        merged = group_spans(spans, self._span_field)
        out: list[bytes] = []
        for resource, scopes in merged.items():
            scope_spans: list[bytes] = [self.resource_field(resource)]
            for scope, encoded in scopes.items():
                schema = _text(b"\x1a", scope.schema_url) if scope is not None and scope.schema_url else b""
                body = b"".join([self.scope_field(scope), *encoded, schema])
                scope_spans.append(_field(b"\x12", body))  # ResourceSpans.scope_spans (2)
            if resource.schema_url:
                scope_spans.append(_text(b"\x1a", resource.schema_url))
            out.append(_field(b"\x0a", b"".join(scope_spans)))  # ExportTraceServiceRequest.resource_spans
        return b"".join(out)

    def _span_field(self, span: ReadableSpan) -> bytes:
        return _field(b"\x12", self._span(span))  # ScopeSpans.spans (2)

    def _span(self, span: ReadableSpan) -> bytes:
        context = span.context
        assert context is not None  # a finished SDK span always has one
        trace_id = context.trace_id
        parts = [_IDS.pack(b"\x0a\x10", trace_id >> 64, trace_id & _M64, b"\x12\x08", context.span_id)]
        trace_state = context.trace_state
        if trace_state:
            parts.append(_text(b"\x1a", ",".join([f"{key}={value}" for key, value in trace_state.items()])))
        parent = span.parent
        if parent is not None:
            parts.append(_PARENT.pack(b"\x22\x08", parent.span_id))
        name = span.name
        if name:
            parts.append(_text(b"\x2a", name))
        parts.append(_KIND_FIELD[span.kind])
        start, end = span.start_time, span.end_time
        if start and end:
            parts.append(_TIMES.pack(0x39, start, 0x41, end))
        else:
            if start:
                parts.append(b"\x39" + _FIXED64.pack(start))
            if end:
                parts.append(b"\x41" + _FIXED64.pack(end))
        attributes = span_attributes(span)
        if attributes:
            parts.extend(self._span_pairs.encode(attributes))
        raw = getattr(span, "_attributes", None)
        dropped = raw.dropped if isinstance(raw, BoundedAttributes) else 0
        if dropped:
            parts.append(b"\x50" + varint(dropped))
        events, dropped = span_events(span)
        if events:
            parts.extend([_field(b"\x5a", _event(event)) for event in events])
        if dropped:
            parts.append(b"\x60" + varint(dropped))
        links, dropped = span_links(span)
        if links:
            parts.extend([_field(b"\x6a", _link(link)) for link in links])
        if dropped:
            parts.append(b"\x70" + varint(dropped))
        parts.append(_status(span))
        parts.append(_FLAGS_REMOTE if parent is not None and parent.is_remote else _FLAGS_LOCAL)
        return b"".join(parts)


def _event(event: Event) -> bytes:
    parts: list[bytes] = []
    if event.timestamp:
        parts.append(b"\x09" + _FIXED64.pack(event.timestamp))
    if event.name:
        parts.append(_text(b"\x12", event.name))
    parts.append(encode_key_values(b"\x1a", event.attributes))
    if event.dropped_attributes:
        parts.append(b"\x20" + varint(event.dropped_attributes))
    return b"".join(parts)


def _link(link: Link) -> bytes:
    context = link.context
    trace_id = context.trace_id
    parts = [
        _IDS.pack(b"\x0a\x10", trace_id >> 64, trace_id & _M64, b"\x12\x08", context.span_id),
        encode_key_values(b"\x22", link.attributes),
    ]
    if link.dropped_attributes:
        parts.append(b"\x28" + varint(link.dropped_attributes))
    parts.append(_LINK_FLAGS_REMOTE if context.is_remote else _LINK_FLAGS_LOCAL)
    return b"".join(parts)


_EMPTY_STATUS: Final = b"\x7a\x00"


def _status(span: ReadableSpan) -> bytes:
    """``Span.status`` (15): always written, as the official encoder always sets it."""
    status = span.status
    code = status.status_code.value
    description = status.description
    if not code and not description:
        return _EMPTY_STATUS
    body = _text(b"\x12", description) if description else b""
    if code:
        body += bytes((0x18, code))
    return _field(b"\x7a", body)

