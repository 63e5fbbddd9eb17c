"""The model-call layer's readers: a JSON reply (the usual chat reply in one frame, any other by genai) and
the byte tests that pick a stream's late events.

A chat completion almost always has one choice, a ``usage`` with both counts and no details, a printable
model name and a plain-word id. Reading that through the general reader (``facts_from_data``) costs eight
Python calls and ~400 bytecodes per call; here it is one function that looks at the same values with the
same checks and stores them only when every one is of the usual kind. Anything else -- a second choice,
token details, an odd id, a bad count, a reply that is not an object -- is read by the general reader from
the start, so hostile input meets the same code as before. Either way nothing raises.
"""

from __future__ import annotations

from typing import Final

import orjson

from gym_obs.telemetry import names
from gym_obs.telemetry.genai import (
    CHAT_FINISH,
    MAX_NAME_CHARS,
    MAX_TOKENS,
    ONE_FINISH,
    ReplyFacts,
    facts_from_data,
)
from gym_obs.telemetry.redaction import is_plain_word

__all__ = ["event_data", "late_event", "read_json_reply"]

_CHAT: Final = names.GEN_AI_OPERATION_CHAT
_OTHER: Final = names.GEN_AI_FINISH_OTHER


def read_json_reply(operation: str, body: bytes | list[bytes] | None, facts: ReplyFacts) -> tuple[str] | None:
    """Read one JSON reply (``body``: its one part, or its parts) of ``operation``'s dialect into ``facts``,
    which are new (nothing read into them yet): the same facts as
    :func:`~gym_obs.telemetry.genai.facts_from_json`. Never raises.

    Returns the reply's finish reasons (``ONE_FINISH``'s tuple) when it was a usual chat reply (one choice
    with a finish reason): then the facts are both counts, that reason, the model and a plain-word id, and
    nothing else (no other count, no problem); else None (the general reader read it)."""
    if type(body) is not bytes:  # several parts, none, or another bytes-like part (the usual: one part)
        body = b"".join(body) if isinstance(body, list) else bytes(body or b"")
    try:
        data = orjson.loads(body)
    except Exception:
        facts.flag(names.GEN_AI_UNPARSABLE_MALFORMED)
        return None
    if operation == _CHAT and type(data) is dict:
        choices = data.get("choices")
        usage = data.get("usage")
        model = data.get("model")
        reply_id = data.get("id")
        if (
            type(choices) is list
            and len(choices) == 1
            and type(usage) is dict
            and type(model) is str
            and type(reply_id) is str
            and model
            and len(model) <= MAX_NAME_CHARS
            and len(reply_id) <= MAX_NAME_CHARS  # (not empty: is_plain_word below says so)
        ):
            choice = choices[0]
            prompt = usage.get("prompt_tokens")
            completion = usage.get("completion_tokens")
            reason = choice.get("finish_reason") if type(choice) is dict else None
            if (
                type(reason) is str
                and type(prompt) is int
                and type(completion) is int
                and 0 <= prompt <= MAX_TOKENS
                and 0 <= completion <= MAX_TOKENS
                and usage.get("prompt_tokens_details") is None
                and usage.get("completion_tokens_details") is None
                and model.isprintable()
                and is_plain_word(reply_id)
            ):
                # stored as ReplyFacts.add_finish and note_id store them in new facts (one finish reason,
                # a plain-word id), without their calls
                facts.input_tokens = prompt
                facts.output_tokens = completion
                facts.response_model = model
                facts.response_id = facts._plain_id = reply_id
                index = choice.get("index")  # (a dict: reason is a str)
                facts._finish_index = index if type(index) is int else 0
                facts._finish_reason = reason = CHAT_FINISH.get(reason, _OTHER)
                return ONE_FINISH[reason]
    facts_from_data(operation, data, facts)
    return None


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
