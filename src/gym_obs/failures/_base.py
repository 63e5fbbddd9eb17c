"""Bounds and the id format shared by every failure module (the error type is in :mod:`.errors`).

Every limit a remote report is checked against lives here, so the encoder (which must produce reports the
decoder accepts) and the validator cannot drift apart.
"""

from __future__ import annotations

import re
import secrets
from typing import Final

EVENT_ID_PREFIX: Final = "fe_"
EVENT_ID_PATTERN: Final = r"fe_[0-9a-f]{24}"
EVENT_ID_RE: Final = re.compile(EVENT_ID_PATTERN)
TRACE_ID_RE: Final = re.compile(r"[0-9a-f]{32}")
SPAN_ID_RE: Final = re.compile(r"[0-9a-f]{16}")

MAX_REASON_CHARS: Final = 1000
"""A failure reason is a sentence, not a log file."""
MAX_TYPE_NAME_CHARS: Final = 200
MAX_LABEL_CHARS: Final = 128
"""rollout ids and server names."""
MAX_DETAILS_BYTES: Final = 2048
"""Serialized size of ``details``; larger details are replaced by a truncation marker."""
MAX_DETAILS_DEPTH: Final = 4
MAX_DETAILS_ITEMS: Final = 32
MAX_DETAILS_STRING_CHARS: Final = 256
MAX_EVENTS: Final = 64
"""Events in one report (the final failure's chain plus recovered failures)."""
MAX_DEPTH: Final = 32
"""Longest cause chain in one report; longer chains are cut in the middle."""
MAX_SKIPPED: Final = 1_000_000
MAX_HTTP_STATUS: Final = 599
MIN_HTTP_STATUS: Final = 100


def new_event_id() -> str:
    """A fresh event id: ``fe_`` and 96 random bits in hex."""
    return EVENT_ID_PREFIX + secrets.token_hex(12)


def utf8_safe(text: str) -> str:
    """``text`` with lone surrogates (undecodable bytes from file names, the environment) replaced: a record
    must always serialize as UTF-8 JSON."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


def bounded(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, marking the cut with an ellipsis."""
    if len(text) <= limit:
        return text
    return text[: limit - 1] + "…" if limit > 0 else ""


# Removed from every string a peer sends (and from details): C0 controls (ESC starts a terminal escape), DEL,
# C1 controls (0x9b is a one-byte CSI), bidi overrides ("trojan source") and lone surrogates.
_CONTROLS: Final = (
    *range(0x00, 0x20), 0x7F, *range(0x80, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A),
    *range(0xD800, 0xE000),
)
_LINE_CONTROLS: Final[dict[int, None]] = dict.fromkeys(_CONTROLS)
_TEXT_CONTROLS: Final[dict[int, None]] = {code: None for code in _CONTROLS if code not in (0x09, 0x0A)}


def without_controls(text: str, *, keep_lines: bool = False) -> str:
    """``text`` with every control character removed (``keep_lines``: newline and tab stay)."""
    return text.translate(_TEXT_CONTROLS if keep_lines else _LINE_CONTROLS)
