"""The model-call layer's JSON reply reader: the usual chat reply read in one frame, any other by genai.

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

__all__ = ["read_json_reply"]

_CHAT: Final = names.GEN_AI_OPERATION_CHAT
_OTHER: Final = names.GEN_AI_FINISH_OTHER


def read_json_reply(operation: str, body: bytes, facts: ReplyFacts) -> tuple[str] | None:
    """Read one JSON reply of ``operation``'s dialect into ``facts``, which are new (nothing read into them
    yet): the same facts as :func:`~gym_obs.telemetry.genai.facts_from_json`. Never raises.

    Returns the reply's finish reasons (``ONE_FINISH``'s tuple) when it was a usual chat reply (one choice
    with a finish reason): then the facts are both counts, that reason, the model and a plain-word id, and
    nothing else (no other count, no problem); else None (the general reader read it)."""
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
