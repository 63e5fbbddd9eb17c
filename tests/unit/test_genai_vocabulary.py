"""The model-call vocabulary: dialects by route, token counts and finish reasons from replies, the SSE reader.

Hostile input is the norm here: every malformed, truncated or absurd reply must come back as facts with a
problem flagged, never as an exception.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gym_obs.telemetry import names
from gym_obs.telemetry.genai import (
    MAX_TOKENS,
    ReplyFacts,
    SseEvents,
    clean_name,
    dialect_for_path,
    facts_from_json,
    model_from_request_body,
    span_id,
    update_from_event,
)

CHAT = names.GEN_AI_OPERATION_CHAT
RESPONSES = names.GEN_AI_OPERATION_RESPONSES
MESSAGES = names.GEN_AI_OPERATION_MESSAGES


def _json(data: Any) -> bytes:
    return json.dumps(data).encode()


@pytest.mark.parametrize(
    ("path", "operation"),
    [
        ("/v1/chat/completions", CHAT),
        ("/v1/responses", RESPONSES),
        ("/v1/messages", MESSAGES),
        ("/v1/messages/", MESSAGES),
        ("/ng-rollout/r-1/v1/chat/completions", CHAT),
        ("/ng-rollout/a%2Fb/v1/responses", RESPONSES),
        ("/v1/embeddings", None),
        ("/v1/responses/extra", None),
        ("/ng-rollout/r-1", None),
        ("/", None),
        ("", None),
    ],
)
def test_dialect_by_route(path: str, operation: str | None) -> None:
    assert dialect_for_path(path) == operation


def test_chat_json_reply_gives_every_token_type_and_finish_reasons_per_choice() -> None:
    body = {
        "model": "gpt-x",
        "id": "chatcmpl-1",
        "choices": [
            {"index": 0, "finish_reason": "stop"},
            {"index": 1, "finish_reason": "tool_calls"},
            {"index": 2, "finish_reason": "brand_new_reason"},
        ],
        "usage": {
            "prompt_tokens": 100,
            "completion_tokens": 20,
            "prompt_tokens_details": {"cached_tokens": 60},
            "completion_tokens_details": {"reasoning_tokens": 7},
        },
    }
    facts = facts_from_json(CHAT, _json(body))
    assert dict(facts.tokens()) == {"input": 100, "output": 20, "cached_input": 60, "reasoning": 7}
    assert facts.finish_reasons == ["stop", "tool_call", "other"]
    assert (facts.response_model, facts.response_id, facts.problem) == ("gpt-x", "chatcmpl-1", None)


def test_responses_json_reply_maps_status_to_finish_reasons() -> None:
    usage = {"input_tokens": 5, "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 2}}
    done = facts_from_json(RESPONSES, _json({"status": "completed", "usage": usage, "output": []}))
    assert done.finish_reasons == ["stop"] and dict(done.tokens()) == {
        "input": 5,
        "output": 3,
        "reasoning": 2,
    }
    tool = facts_from_json(
        RESPONSES, _json({"status": "completed", "usage": usage, "output": [{"type": "function_call"}]})
    )
    assert tool.finish_reasons == ["tool_call"]
    cut = facts_from_json(
        RESPONSES,
        _json(
            {"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}, "usage": usage}
        ),
    )
    assert cut.finish_reasons == ["length"]
    failed = facts_from_json(RESPONSES, _json({"status": "failed", "usage": usage}))
    assert failed.finish_reasons == ["error"]


def test_messages_json_reply_counts_cached_input_inside_input_as_the_conventions_say() -> None:
    body = {
        "stop_reason": "max_tokens",
        "usage": {
            "input_tokens": 10,
            "cache_read_input_tokens": 30,
            "cache_creation_input_tokens": 5,
            "output_tokens": 8,
        },
    }
    facts = facts_from_json(MESSAGES, _json(body))
    assert dict(facts.tokens()) == {"input": 45, "output": 8, "cached_input": 30}
    assert facts.finish_reasons == ["length"]


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"", names.GEN_AI_UNPARSABLE_MALFORMED),
        (b'{"usage": {"prompt_tokens": 1', names.GEN_AI_UNPARSABLE_MALFORMED),
        (b"[1, 2]", names.GEN_AI_UNPARSABLE_MALFORMED),
        (b"\xff\xfe", names.GEN_AI_UNPARSABLE_MALFORMED),
        (b'{"choices": []}', names.GEN_AI_UNPARSABLE_MISSING_USAGE),
        (b'{"usage": null}', names.GEN_AI_UNPARSABLE_MISSING_USAGE),
        (b'{"usage": "lots"}', names.GEN_AI_UNPARSABLE_INVALID_USAGE),
        (b'{"usage": {"prompt_tokens": -1, "completion_tokens": 2}}', names.GEN_AI_UNPARSABLE_INVALID_USAGE),
        (b'{"usage": {"prompt_tokens": true}}', names.GEN_AI_UNPARSABLE_INVALID_USAGE),
        (b'{"usage": {"prompt_tokens": 1.5}}', names.GEN_AI_UNPARSABLE_INVALID_USAGE),
        (b'{"usage": {"prompt_tokens": 1e300}}', names.GEN_AI_UNPARSABLE_INVALID_USAGE),
        (b'{"usage": {"prompt_tokens": 99999999999999999999999}}', names.GEN_AI_UNPARSABLE_INVALID_USAGE),
        (b'{"usage": {"prompt_tokens": "12"}}', names.GEN_AI_UNPARSABLE_INVALID_USAGE),
        (b'{"choices": [{"finish_reason": ["x"]}], "usage": {"prompt_tokens": 1}}', None),
        (b'{"choices": "nope", "model": 7, "usage": {"prompt_tokens": 1}}', None),
    ],
)
def test_hostile_chat_replies_never_raise_and_flag_one_problem(body: bytes, problem: str | None) -> None:
    facts = facts_from_json(CHAT, body)
    assert facts.problem == problem
    assert all(0 <= count <= MAX_TOKENS for _, count in facts.tokens())


def test_absurd_count_is_dropped_but_the_valid_one_kept() -> None:
    facts = facts_from_json(CHAT, _json({"usage": {"prompt_tokens": MAX_TOKENS + 1, "completion_tokens": 4}}))
    assert dict(facts.tokens()) == {"output": 4}
    assert facts.problem == names.GEN_AI_UNPARSABLE_INVALID_USAGE


def test_unprintable_or_huge_model_names_never_reach_the_facts() -> None:
    facts = facts_from_json(CHAT, _json({"model": "bad\x1b[31mname", "id": "x" * 5000, "usage": {}}))
    assert facts.response_model is None
    assert facts.response_id is not None and len(facts.response_id) == 256


@pytest.mark.parametrize(
    "reply_id",
    [
        f"chatcmpl-{7:032x}",  # a plain word: known clean and its own scrub
        "chatcmpl-9xAbCkgJ",  # a word with marks: the searches run
        "resp_" + "a" * 32,
        "chatcmpl-sk-" + "A" * 20,  # a key inside an id
        "AKIA" + "B" * 16,
        "caf\u00e9-1",
        "a\x01b",
        "x" * 300,  # cut to 256 by clean_name
        "",
        5,
        None,
    ],
)
def test_a_replys_id_for_a_span_is_span_id_of_its_clean_id(reply_id: object) -> None:
    for facts in (
        facts_from_json(CHAT, _json({"id": reply_id, "usage": {}})),
        _stream_facts(_json({"id": reply_id, "choices": []})),
    ):
        assert facts.response_id == clean_name(reply_id)
        assert facts.span_response_id() == span_id(facts.response_id)
    facts.response_id = "sk-" + "C" * 20  # replaced after the plain one was noted: scrubbed all the same
    assert facts.span_response_id() == span_id(facts.response_id) != facts.response_id


def _stream_facts(event: bytes) -> ReplyFacts:
    facts = ReplyFacts()
    update_from_event(CHAT, event, facts)
    return facts


def _events(stream: bytes, piece: int) -> list[bytes]:
    reader = SseEvents()
    out: list[bytes] = []
    for start in range(0, len(stream), piece):
        out.extend(reader.feed(stream[start : start + piece]))
    return out


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_sse_reader_gives_the_same_events_whatever_the_chunking(newline: bytes) -> None:
    text = (
        b'event: a\ndata: {"n": 1}\n\n: a comment\n\ndata: line one\ndata: line two\n\ndata:nospace\n\n'
        b"id: 7\nretry: 10\ndata: [DONE]\n\n"
    )
    stream = text.replace(b"\n", newline)
    expected = [b'{"n": 1}', b"line one\nline two", b"nospace", b"[DONE]"]
    for piece in (1, 2, 3, 7, len(stream)):
        assert _events(stream, piece) == expected, piece


def test_sse_reader_drops_an_oversized_line_without_growing() -> None:
    reader = SseEvents(max_line_bytes=1000)
    assert reader.feed(b"data: " + b"x" * 5000) == []
    assert reader.dropped and reader.pending
    for _ in range(100):
        reader.feed(b"y" * 5000)  # still the same line: never buffered
    assert reader.feed(b"\n\ndata: ok\n\n") == [b"ok"]
    assert not reader.pending


def test_sse_reader_keeps_a_truncated_event_pending() -> None:
    reader = SseEvents()
    assert reader.feed(b'data: {"type": "message_delta"') == []
    assert reader.pending


@pytest.mark.parametrize(
    ("operation", "event", "content"),
    [
        (CHAT, {"choices": [{"delta": {"role": "assistant", "content": ""}}]}, False),
        (CHAT, {"choices": [{"delta": {"content": "Hi"}}]}, True),
        (CHAT, {"choices": [{"delta": {"tool_calls": [{"index": 0}]}}]}, True),
        (CHAT, {"choices": [{"delta": {"reasoning_content": "hmm"}}]}, True),
        (RESPONSES, {"type": "response.created", "response": {"model": "m"}}, False),
        (RESPONSES, {"type": "response.output_text.delta", "delta": "Hi"}, True),
        (RESPONSES, {"type": "response.reasoning_summary_text.delta", "delta": "x"}, True),
        (MESSAGES, {"type": "message_start", "message": {"usage": {"input_tokens": 3}}}, False),
        (MESSAGES, {"type": "content_block_start", "content_block": {"type": "text", "text": ""}}, False),
        (MESSAGES, {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "Hi"}}, True),
    ],
)
def test_first_content_event_by_dialect(operation: str, event: dict[str, Any], content: bool) -> None:
    assert update_from_event(operation, _json(event), ReplyFacts()) is content


def test_stream_events_fold_into_usage_and_finish_reasons() -> None:
    facts = ReplyFacts()
    for event in (
        {"type": "message_start", "message": {"model": "claude-x", "usage": {"input_tokens": 12}}},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 40}},
    ):
        update_from_event(MESSAGES, _json(event), facts)
    assert dict(facts.tokens()) == {"input": 12, "output": 40}
    assert facts.finish_reasons == ["tool_call"] and facts.response_model == "claude-x"
    chat = ReplyFacts()
    update_from_event(CHAT, b"[DONE]", chat)
    update_from_event(CHAT, b"{not json", chat)
    assert chat.problem == names.GEN_AI_UNPARSABLE_MALFORMED


def test_request_model_is_found_without_parsing_the_document() -> None:
    assert (
        model_from_request_body(b'{"messages": [{"content": "\\"model\\": \\"no\\""}], "model": "m-1"}')
        == "m-1"
    )
    assert model_from_request_body(b'{"model" :  "gpt-4o-mini", "x": 1}') == "gpt-4o-mini"
    assert model_from_request_body(b'{"model": 7}') is None
    assert model_from_request_body(b'{"model": "' + b"x" * 300 + b'"}') is None
    assert model_from_request_body(b"") is None
