"""The ``X-NG-Failure-Report`` wire format: ``v1.`` + base64url(zlib(JSON payload)), no padding.

Encoding never exceeds ``max_bytes``: when a report does not fit, events are dropped by the rule in
:mod:`gym_obs.failures._shrink` (middle first; the final failure and its root cause are always kept), and
if the final failure and its root cause alone still do not fit, their details are dropped and reasons cut
(to 200, then 40 characters, then to a bare ellipsis with long exception type names cut too), then the root
cause is dropped, and as the last resort the result is ``""`` (send no header). ``max_bytes`` above
``MAX_MAX_BYTES`` is lowered to it (the value must fit in one aiohttp header field); a ``max_bytes`` too small
for anything yields ``""``. Encoding never raises for a valid ``FailureReport``. Whatever was
cut is marked: ``truncated``/``dropped`` on the report, ``skipped`` on the record before the gap, an
ellipsis on a cut reason.

Decoding is bounded: the encoded value, the decompressed size (``zlib.decompressobj`` with ``max_length``,
so a zip bomb costs at most ``MAX_DECOMPRESSED_BYTES``) and everything the validator checks.
"""

from __future__ import annotations

import base64
import binascii
import re
import zlib
from typing import Any, Final

import orjson

from gym_obs.failures._base import MAX_SKIPPED, bounded
from gym_obs.failures._shrink import apply_drops, drop_order, final_chain
from gym_obs.failures.errors import InvalidFailureReport
from gym_obs.failures.report import FailureReport

VERSION_PREFIX: Final = "v1."
MAX_ENCODED_CHARS: Final = 65_536
"""Longest value ``decode_failure_report`` accepts (reports in reply bodies may exceed a header's size)."""
MAX_DECOMPRESSED_BYTES: Final = 262_144
MIN_MAX_BYTES: Final = 512
"""Smallest ``max_bytes`` at which the final failure is expected to fit (smaller values may yield ``""``)."""
MAX_MAX_BYTES: Final = 8000
"""Largest header value ever produced: it must stay under aiohttp's 8190-byte header field limit."""

_B64URL = re.compile(r"[A-Za-z0-9_\-]*")
_DEGRADE_REASON_CHARS: Final = (200, 40, 1)
_DEGRADE_TYPE_CHARS: Final = 64


def encode_report(report: FailureReport, max_bytes: int = 4096) -> str:
    """Encode ``report`` as an ASCII header value of at most ``max_bytes`` characters (see module doc)."""
    max_bytes = min(int(max_bytes), MAX_MAX_BYTES)
    if max_bytes <= len(VERSION_PREFIX):
        return ""
    events = report.events
    encoded = _encode(report.failure_id, events, report.truncated, report.dropped)
    if len(encoded) <= max_bytes:
        return encoded
    order = drop_order(events, report.failure_id)

    def attempt(count: int) -> tuple[str, dict[str, dict[str, Any]]]:
        kept = apply_drops(events, set(order[:count]))
        return _encode(report.failure_id, kept, True, report.dropped + count), kept

    low, high = 1, len(order)
    best: str | None = None
    while low <= high:  # smallest number of drops that fits
        mid = (low + high) // 2
        candidate, _ = attempt(mid)
        if len(candidate) <= max_bytes:
            best, high = candidate, mid - 1
        else:
            low = mid + 1
    if best is not None:
        return best
    _, kept = attempt(len(order))
    return _degrade(report, kept, report.dropped + len(order), max_bytes)


def _degrade(report: FailureReport, kept: dict[str, dict[str, Any]], dropped: int, max_bytes: int) -> str:
    """Only the final failure and its root cause are left and they do not fit: shrink their fields."""
    for limit in _DEGRADE_REASON_CHARS:
        for record in kept.values():
            record["details"] = None
            record["failure_reason"] = bounded(record["failure_reason"], limit)
            if limit == 1 and record.get("exception_type"):
                record["exception_type"] = bounded(record["exception_type"], _DEGRADE_TYPE_CHARS)
        encoded = _encode(report.failure_id, kept, True, dropped)
        if len(encoded) <= max_bytes:
            return encoded
    chain = final_chain(kept, report.failure_id)
    if len(chain) > 1:  # last resort before nothing: the final failure alone
        only_final = apply_drops(kept, set(chain[1:]))
        encoded = _encode(report.failure_id, only_final, True, dropped + len(chain) - 1)
        if len(encoded) <= max_bytes:
            return encoded
    return ""


def _encode(failure_id: str | None, events: dict[str, dict[str, Any]], truncated: bool, dropped: int) -> str:
    payload = {
        "failure_id": failure_id,
        "events": events,
        "truncated": truncated,
        "dropped": min(dropped, MAX_SKIPPED),
    }
    packed = zlib.compress(orjson.dumps(payload), 9)
    return VERSION_PREFIX + base64.urlsafe_b64encode(packed).rstrip(b"=").decode("ascii")


def decode_report(value: object) -> FailureReport:
    """Decode and validate a header value (or encoded body string); raises only ``InvalidFailureReport``."""
    try:
        return _decode(value)
    except InvalidFailureReport:
        raise
    except Exception as exc:  # belt and braces: nothing else may escape
        raise InvalidFailureReport(f"undecodable failure report ({type(exc).__name__})") from None


def _decode(value: object) -> FailureReport:
    if isinstance(value, bytes | bytearray):
        if len(value) > MAX_ENCODED_CHARS:
            raise InvalidFailureReport("failure report too long")
        try:
            value = bytes(value).decode("ascii")
        except UnicodeDecodeError:
            raise InvalidFailureReport("failure report is not ASCII") from None
    if not isinstance(value, str):
        raise InvalidFailureReport("failure report must be a string")
    if len(value) > MAX_ENCODED_CHARS:
        raise InvalidFailureReport("failure report too long")
    value = value.strip()
    if not value.startswith(VERSION_PREFIX):
        raise InvalidFailureReport("unsupported failure report version")
    body = value[len(VERSION_PREFIX) :]
    if _B64URL.fullmatch(body) is None:
        raise InvalidFailureReport("failure report is not base64url")
    try:
        packed = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (binascii.Error, ValueError):
        raise InvalidFailureReport("failure report is not base64url") from None
    decompressor = zlib.decompressobj()
    try:
        raw = decompressor.decompress(packed, MAX_DECOMPRESSED_BYTES)
    except zlib.error:
        raise InvalidFailureReport("failure report is not zlib data") from None
    if decompressor.unconsumed_tail or len(raw) >= MAX_DECOMPRESSED_BYTES:
        raise InvalidFailureReport("failure report decompresses too large")
    if not decompressor.eof or decompressor.unused_data:
        raise InvalidFailureReport("failure report is truncated or has trailing data")
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidFailureReport("failure report is not JSON") from None
    return FailureReport.from_payload(payload)
