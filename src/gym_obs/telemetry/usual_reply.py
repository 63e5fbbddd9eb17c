"""A model's JSON reply read in one frame when it is the usual one, by genai's general reader otherwise.

A chat completion almost always has one choice, a ``usage`` with both counts and no details, a printable
model name and id; a Responses object is almost always ``completed``, with both counts, no details, a
printable model and id. Reading one through the general reader
(``genai.facts_from_data``) costs several Python calls and a few hundred bytecodes; here one function looks
at the same values with the same checks and stores them only when every one is of the usual kind. Anything
else -- a second choice, token details, another status, an odd id, a bad count, a reply that is not an
object -- is read by the general reader from the start, so hostile input meets the same code as before.
Either way nothing raises. Both sides of a model call read replies here: the model-call layer of a model
server, and the client's.
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
    TOOL_ITEMS,
    ReplyFacts,
    facts_from_data,
)
from gym_obs.telemetry.redaction import is_plain_word

__all__ = ["read_json_reply"]

_CHAT: Final = names.GEN_AI_OPERATION_CHAT
_RESPONSES: Final = names.GEN_AI_OPERATION_RESPONSES
_OTHER: Final = names.GEN_AI_FINISH_OTHER
_STOP: Final = ONE_FINISH[names.GEN_AI_FINISH_STOP]
_TOOL_CALL: Final = ONE_FINISH[names.GEN_AI_FINISH_TOOL_CALL]


def read_json_reply(operation: str, body: bytes | list[bytes] | None, facts: ReplyFacts) -> tuple[str] | None:
    """Read one JSON reply (``body``: its one part, or its parts) of ``operation``'s dialect into ``facts``,
    which are new (nothing read into them yet): the same facts as
    :func:`~gym_obs.telemetry.genai.facts_from_json`. Never raises.

    Returns the reply's finish reasons (``ONE_FINISH``'s tuple) when it was a usual chat or Responses reply:
    then the facts are both counts, that one reason, the model and the id, and nothing else (no other count,
    no problem); else None (the general reader read it). One frame for both dialects: this runs for every
    model call, and each Python call it made would cost more than the checks it holds."""
    if type(body) is not bytes:  # several parts, none, or another bytes-like part (the usual: one part)
        body = b"".join(body) if isinstance(body, list) else bytes(body or b"")
    try:
        data = orjson.loads(body)
    except Exception:
        facts.flag(names.GEN_AI_UNPARSABLE_MALFORMED)
        return None
    if type(data) is dict:
        usual: tuple[str] | None = None  # the finish reasons, once the dialect's own shape is the usual one
        given = made = index = None
        details = True
        if operation == _CHAT:  # one choice with a finish reason
            choices = data.get("choices")
            usage = data.get("usage")
            if type(choices) is list and len(choices) == 1 and type(usage) is dict:
                choice = choices[0]
                reason = choice.get("finish_reason") if type(choice) is dict else None
                if type(reason) is str:
                    usual = ONE_FINISH[CHAT_FINISH.get(reason, _OTHER)]
                    index = choice.get("index")
                    given, made = usage.get("prompt_tokens"), usage.get("completion_tokens")
                    details = (
                        usage.get("prompt_tokens_details") is not None
                        or usage.get("completion_tokens_details") is not None
                    )
        elif operation == _RESPONSES:  # completed; a tool call when an output item is one, else stop
            usage = data.get("usage")
            output = data.get("output")
            if data.get("status") == "completed" and type(usage) is dict and type(output) is list:
                usual = _STOP
                for item in output:
                    if type(item) is dict:
                        kind = item.get("type")
                        if type(kind) is not str:  # an odd type: the general reader's business
                            usual = None
                            break
                        if kind in TOOL_ITEMS:
                            usual = _TOOL_CALL
                            break
                given, made = usage.get("input_tokens"), usage.get("output_tokens")
                details = (
                    usage.get("input_tokens_details") is not None
                    or usage.get("output_tokens_details") is not None
                )
        if usual is not None and not details:
            model = data.get("model")
            reply_id = data.get("id")
            if (  # both counts valid, a printable model and id that fit a span: stored as they are
                type(given) is int
                and type(made) is int
                and 0 <= given <= MAX_TOKENS
                and 0 <= made <= MAX_TOKENS
                and type(model) is str
                and type(reply_id) is str
                and 0 < len(model) <= MAX_NAME_CHARS
                and 0 < len(reply_id) <= MAX_NAME_CHARS
                and model.isprintable()
                and reply_id.isprintable()
            ):
                # what the usage reader, note_model, note_id and add_finish store in new facts for these
                # values (a plain-word id is known to be its own scrub), without their calls
                facts.input_tokens = given
                facts.output_tokens = made
                facts.response_model = model
                facts.response_id = reply_id
                if is_plain_word(reply_id):
                    facts._plain_id = reply_id
                facts._finish_index = index if type(index) is int else 0
                facts._finish_reason = usual[0]
                return usual
    facts_from_data(operation, data, facts)
    return None
