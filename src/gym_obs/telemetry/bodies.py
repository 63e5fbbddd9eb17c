"""Bounded, scrubbed excerpts of upstream bodies for logs, spans and failure records.

An upstream error body can be megabytes of HTML or a Python traceback whose useful line is the last one, so
an excerpt keeps a short head and a longer tail around one marker saying how much was left out.

The bound, precisely: ``len(bounded_excerpt(x, limit)) <= max(limit, 0) + MAX_MARKER_CHARS``. When nothing
is left out the result is the whole rendered body (at most ``limit`` characters) with no marker; otherwise it
is ``head + marker + tail`` with ``len(head) + len(tail) <= limit``, ``len(head) <= limit // 3``.

Rendering: bytes are decoded as UTF-8 (invalid sequences become U+FFFD, never an error), secrets are removed
with :func:`~gym_obs.telemetry.redaction.scrub_text`, and control characters are replaced one-for-one by
visible stand-ins (``\\n`` and ``\\t`` are kept so tracebacks stay readable), so the excerpt is safe to print
to a terminal or embed in a log line.

Large bodies are never decoded or scrubbed whole: only a window at each end is. Windows are cut on a line
break (else a space) near the cut point, so a token such as an API key is not split in half by the cut; where
no break is near, the text just past the cut is scrubbed along with the window, so a secret split by the cut
is still recognised and removed.
"""

from __future__ import annotations

from typing import Final

from gym_obs.telemetry.redaction import scrub_text

__all__ = ["MAX_MARKER_CHARS", "UPSTREAM_ERROR_LOG_BODY_CHARS", "bounded_excerpt", "elision_marker"]

UPSTREAM_ERROR_LOG_BODY_CHARS: Final = 2000
"""Default excerpt size for upstream error bodies."""

MAX_MARKER_CHARS: Final = 40
"""Upper bound on the length of the elision marker (a 20-digit count fits)."""

_UNRENDERABLE: Final = "<unrenderable body>"
# Inputs up to this many units (times the limit, plus a constant) are rendered whole, which makes the
# marker count exact in rendered characters. Larger ones are windowed and counted in input units.
_FULL_RENDER_FACTOR: Final = 4
_FULL_RENDER_EXTRA: Final = 8192
_MAX_ALIGN: Final = 256
_SCRUB_MARGIN: Final = 512  # units past each cut that are scrubbed along with the window (see _scrubbed_head)


def _build_escape_table() -> dict[int, str]:
    table: dict[int, str] = {}
    for code in range(0x20):
        if chr(code) not in "\n\t":
            table[code] = chr(0x2400 + code)  # Unicode "control pictures": ␀ ␁ … ␟
    table[0x7F] = "\u2421"  # ␡
    for code in range(0x80, 0xA0):  # C1 controls (0x9b is a terminal CSI)
        table[code] = "\ufffd"
    for code in (*range(0x202A, 0x202F), *range(0x2066, 0x206A)):  # bidi overrides ("trojan source")
        table[code] = "\ufffd"
    for code in range(0xD800, 0xE000):  # lone surrogates cannot be encoded by any logger
        table[code] = "\ufffd"
    return table


_ESCAPES: Final = _build_escape_table()


def elision_marker(count: int, unit: str = "chars") -> str:
    """The marker that replaces the middle of an excerpt, e.g. ``…[12345 chars elided]…``."""
    return f"…[{count} {unit} elided]…"


def bounded_excerpt(content: bytes | str | None, limit: int = UPSTREAM_ERROR_LOG_BODY_CHARS) -> str:
    """Render ``content`` as at most ``limit`` characters plus one elision marker (see the module doc).

    The marker counts rendered characters for bodies small enough to render whole (up to ``4 * limit +
    8192``); for larger bodies it counts the input units (bytes of a ``bytes`` body, characters of a
    ``str``) that lie between the two windows shown. Never raises.
    """
    try:
        return _bounded_excerpt(content, max(int(limit), 0))
    except Exception:
        return _UNRENDERABLE


def _render(text: str) -> str:
    return scrub_text(text).translate(_ESCAPES)


def _decode(content: bytes | str) -> str:
    return content if isinstance(content, str) else content.decode("utf-8", errors="replace")


def _bounded_excerpt(content: bytes | str | None, limit: int) -> str:
    if content is None:
        return ""
    if isinstance(content, bytearray | memoryview):
        content = bytes(content)
    if not isinstance(content, bytes | str):
        content = str(content)
    head_budget = limit // 3
    tail_budget = limit - head_budget
    if len(content) <= _FULL_RENDER_FACTOR * limit + _FULL_RENDER_EXTRA:
        rendered = _render(_decode(content))
        if len(rendered) <= limit:
            return rendered
        head_end = _align_head(rendered, head_budget)
        tail_start = _align_tail(rendered, len(rendered) - tail_budget)
        elided = tail_start - head_end
        return rendered[:head_end] + elision_marker(elided) + rendered[tail_start:]
    # Windowed: only the two ends are decoded and scrubbed. Cuts are aligned in input units.
    unit = "bytes" if isinstance(content, bytes) else "chars"
    head_end = _align_head(content, head_budget)
    tail_start = _align_tail(content, len(content) - tail_budget)
    if isinstance(content, bytes):
        head_end = _utf8_back(content, head_end)
        tail_start = _utf8_forward(content, tail_start)
    head = _scrubbed_head(content, head_end)[:head_budget]
    tail = _scrubbed_tail(content, tail_start)
    tail = tail[max(len(tail) - tail_budget, 0) :]
    return head + elision_marker(tail_start - head_end, unit) + tail


def _scrubbed_head(content: bytes | str, end: int) -> str:
    """``content[:end]`` rendered; a secret the cut splits is scrubbed as if seen whole.

    Scrubbing only the window would leave the first part of a key that the cut made too short to
    recognise (``sk-abc`` of ``sk-abc…``), so the window is also rendered with ``_SCRUB_MARGIN`` more units
    and, where the two differ, the wider rendering is shown (cut to the same length).
    """
    plain = _render(_decode(content[:end]))
    wide_end = min(end + _SCRUB_MARGIN, len(content))
    if wide_end == end or _at_line_break(content, end):  # no secret pattern spans a line break
        return plain
    if isinstance(content, bytes):
        wide_end = _utf8_back(content, wide_end)
    wide = _render(_decode(content[:wide_end]))
    return plain if wide.startswith(plain) else wide[: len(plain)]


def _scrubbed_tail(content: bytes | str, start: int) -> str:
    """``content[start:]`` rendered; a secret the cut splits (``api_key=`` | ``value``) is scrubbed."""
    plain = _render(_decode(content[start:]))
    wide_start = max(start - _SCRUB_MARGIN, 0)
    if wide_start == start or _at_line_break(content, start):
        return plain
    if isinstance(content, bytes):
        wide_start = _utf8_forward(content, wide_start)
    wide = _render(_decode(content[wide_start:]))
    return plain if wide.endswith(plain) else wide[max(len(wide) - len(plain), 0) :]


def _at_line_break(content: bytes | str, cut: int) -> bool:
    """True when a line break sits right before or at ``cut``."""
    return (cut > 0 and _is_newline(content[cut - 1])) or (cut < len(content) and _is_newline(content[cut]))


def _is_space(unit: str | int) -> bool:
    return unit in (" ", "\t", 0x20, 0x09)


def _is_newline(unit: str | int) -> bool:
    return unit in ("\n", "\r", 0x0A, 0x0D)


def _align_head(content: bytes | str, end: int) -> int:
    """Move the head's end back to just after a line break (else a space) within ``_MAX_ALIGN`` units."""
    if end <= 0 or end >= len(content) or _is_newline(content[end]) or _is_space(content[end]):
        return max(end, 0)
    low = max(end - min(_MAX_ALIGN, end // 4), 0)
    for predicate in (_is_newline, _is_space):
        for i in range(end - 1, low - 1, -1):
            if predicate(content[i]):
                return i + 1
    return end


def _align_tail(content: bytes | str, start: int) -> int:
    """Move the tail's start forward to just after a line break (else a space) within ``_MAX_ALIGN``."""
    if start <= 0:
        return 0
    if _is_newline(content[start - 1]):
        return start
    span = min(_MAX_ALIGN, (len(content) - start) // 4)
    high = min(start + span, len(content))
    for predicate in (_is_newline, _is_space):
        for i in range(start, high):
            if predicate(content[i]):
                return i + 1
    return start


def _utf8_back(data: bytes, end: int) -> int:
    """Move ``end`` back so it does not split a UTF-8 sequence (at most 3 continuation bytes)."""
    for _ in range(3):
        if 0 < end < len(data) and data[end] & 0xC0 == 0x80:
            end -= 1
    return end


def _utf8_forward(data: bytes, start: int) -> int:
    """Move ``start`` forward past continuation bytes of a sequence the cut fell into."""
    for _ in range(3):
        if 0 < start < len(data) and data[start] & 0xC0 == 0x80:
            start += 1
    return start
