"""The model-call layer's byte tests on a stream: an event's data, and whether a late event may carry
usage or a finish reason (JSON replies are read by ``telemetry.usual_reply``)."""

from __future__ import annotations

from gym_obs.telemetry import names

__all__ = ["event_data", "late_event"]


def event_data(block: bytes) -> bytes | None:
    """The ``data`` of one complete SSE event block (its lines joined with newlines), or None."""
    lines = [
        line[6:] if line.startswith(b"data: ") else line[5:]
        for line in block.split(b"\n")
        if line.startswith(b"data:")
    ]
    if not lines:
        return None
    return lines[0] if len(lines) == 1 else b"\n".join(lines)


def _non_null_after(data: bytes, key: bytes) -> bool:
    """Whether ``key`` appears with a value other than ``null`` (no JSON parse)."""
    at = data.find(key)
    while at >= 0:
        rest = data[at + len(key) : at + len(key) + 16].lstrip()
        if rest.startswith(b":") and not rest[1:].lstrip().startswith(b"null"):
            return True
        at = data.find(key, at + len(key))
    return False


def late_event(operation: str, data: bytes) -> bool:
    """Whether an event after the first content may carry usage or a finish reason (parse only those)."""
    if operation == names.GEN_AI_OPERATION_CHAT:
        return _non_null_after(data, b'"usage"') or _non_null_after(data, b'"finish_reason"')
    find = data.find  # not ``in``: on bytes it first tries its operand as an int (an exception each time)
    if operation == names.GEN_AI_OPERATION_RESPONSES:
        return find(b'"response.completed"') >= 0 or find(b'"response.incomplete"') >= 0 or (
            find(b'"response.failed"') >= 0 or find(b'"error"') >= 0
        )
    return find(b"message_delta") >= 0 or find(b'"error"') >= 0
