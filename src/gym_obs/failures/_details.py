"""Make a caller's ``details`` small, JSON-ready and free of secrets before it enters a record.

Details are structured context ("which tool", "exit code"); they travel in a header with a hard size limit
and end up in collection rows, so they are bounded in depth, items, string length and serialized size.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

import orjson

from gym_obs.failures._base import (
    MAX_DETAILS_BYTES,
    MAX_DETAILS_DEPTH,
    MAX_DETAILS_ITEMS,
    MAX_DETAILS_STRING_CHARS,
    bounded,
    utf8_safe,
    without_controls,
)
from gym_obs.telemetry.redaction import REDACTED, is_secret_key, scrub_text

DETAILS_TRUNCATED: Final = "_truncated"
"""Key of the marker that replaces details which do not fit (``{"_truncated": true}``)."""

_MAX_KEY_CHARS: Final = 64
_MAX_INT: Final = 2**63 - 1


def sanitize_details(details: Mapping[str, object] | None) -> dict[str, Any] | None:
    """A bounded, scrubbed, JSON-ready copy of ``details`` (``None`` stays ``None``); never raises."""
    if details is None:
        return None
    try:
        clean = _mapping(details, 1)
        if len(orjson.dumps(clean)) > MAX_DETAILS_BYTES:
            return {DETAILS_TRUNCATED: True}
        return clean
    except Exception:
        return {DETAILS_TRUNCATED: True}


def check_remote_details(details: object) -> dict[str, Any] | None:
    """Remote details: a dict that serializes within the bound (else the truncation marker), then cleaned
    exactly as local details are: keys named like secrets redacted, every string scrubbed and stripped of
    control characters. A peer's details are as hostile as the rest of its report."""
    if details is None:
        return None
    if not isinstance(details, dict):
        return {DETAILS_TRUNCATED: True}
    try:
        if len(orjson.dumps(details)) > MAX_DETAILS_BYTES:
            return {DETAILS_TRUNCATED: True}
    except Exception:  # non-string keys, too deep, integers out of range
        return {DETAILS_TRUNCATED: True}
    return sanitize_details(details)


def _mapping(value: Mapping[Any, object], depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i, (key, item) in enumerate(value.items()):
        if i >= MAX_DETAILS_ITEMS:
            out[DETAILS_TRUNCATED] = True
            break
        raw = key if isinstance(key, str) else str(key)
        name = bounded(scrub_text(without_controls(raw[: _MAX_KEY_CHARS * 4])), _MAX_KEY_CHARS)
        out[name] = REDACTED if is_secret_key(name) else _value(item, depth + 1)
    return out


def _value(value: object, depth: int) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if -_MAX_INT <= value <= _MAX_INT else str(value)[:32]
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return _text(value)
    if depth > MAX_DETAILS_DEPTH:
        return _text(type(value).__name__)
    if isinstance(value, Mapping):
        return _mapping(value, depth)
    if isinstance(value, list | tuple | set | frozenset):
        items = [_value(item, depth + 1) for _, item in zip(range(MAX_DETAILS_ITEMS), value, strict=False)]
        if len(value) > MAX_DETAILS_ITEMS:
            items.append("…")
        return items
    try:
        return _text(str(value))
    except Exception:
        return _text(type(value).__name__)


def _text(text: str) -> str:
    # Cut generously before scrubbing (bounded cost), then to the final bound.
    clean = without_controls(text[: MAX_DETAILS_STRING_CHARS * 4], keep_lines=True)
    return bounded(utf8_safe(scrub_text(clean)), MAX_DETAILS_STRING_CHARS)
