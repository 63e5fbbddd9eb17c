"""The agent's view of a model call under a real uvicorn model server: the CLIENT span carries the GenAI
attributes the SERVER span got, the client metrics agree, and the span ends however the caller treats the
reply (read through the helpers, read with plain aiohttp, released early, dropped, cancelled mid-stream).

The model server is ``test_model_calls_replies``'s (every dialect, JSON and SSE, hostile replies too); the
caller is ``ServerClient`` (the destination's provider and allow-list come from the global config) or a bare
``request()``. Port 30850.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind

from gym_obs import rollout_scope
from gym_obs.client import (
    NOT_A_MODEL_CALL,
    GlobalAIOHTTPAsyncClientConfig,
    ModelCallTarget,
    ResponseJSONError,
    ServerClient,
    close_global_aiohttp_client,
    get_response_json,
    iter_sse_data,
    request,
    set_global_aiohttp_client,
)
from gym_obs.telemetry import names
from gym_obs.telemetry.testing import Capture, MetricPoint, telemetry_state
from tests.integration.test_model_calls_replies import (
    HOSTILE,
    MODEL,
    OPERATIONS,
    ROUTES,
    ReplyModelServer,
    config,
    json_body,
    serving,
    stream_chunks,
)

pytestmark = pytest.mark.integration

PORT = 30850
SERVER = "policy"
TOKENS = {"input": 11, "output": 7, "cached_input": 5}


@pytest.fixture
async def client(telemetry: Capture) -> AsyncIterator[ServerClient]:
    global_config = config(PORT)
    app = ReplyModelServer(SERVER, global_config).build_app()
    with serving(app, PORT):
        set_global_aiohttp_client(GlobalAIOHTTPAsyncClientConfig())
        telemetry.clear()
        yield ServerClient(global_config)
        await close_global_aiohttp_client()


async def post(
    client: ServerClient, operation: str, scenario: str = "ok", stream: bool = False, **body: Any
) -> aiohttp.ClientResponse:
    payload = {"operation": operation, "scenario": scenario, "stream": stream, "model": MODEL, **body}
    return await client.post(SERVER, ROUTES[operation], json=payload, _route=ROUTES[operation])


def wait_for(what: Callable[[], list[ReadableSpan]], count: int = 1) -> list[ReadableSpan]:
    """Spans end on the server's thread just after the reply's last byte: wait for them, briefly."""
    deadline = time.monotonic() + 5
    while len(found := what()) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return found


def client_spans(telemetry: Capture, operation: str) -> list[ReadableSpan]:
    name = f"POST {ROUTES[operation]}"
    return [s for s in telemetry.spans(name) if s.kind is SpanKind.CLIENT]


def one_client_span(telemetry: Capture, operation: str) -> dict[str, Any]:
    (span,) = wait_for(lambda: client_spans(telemetry, operation))
    return dict(span.attributes or {})


def points(telemetry: Capture, metric: str) -> list[MetricPoint]:
    return telemetry.metric_points(metric)


def token_sums(telemetry: Capture) -> dict[str, float]:
    return {
        p.attributes[names.ATTR_GEN_AI_TOKEN_TYPE]: p.sum
        for p in points(telemetry, names.METRIC_GEN_AI_CLIENT_TOKEN_USAGE)
    }


def unparsable(telemetry: Capture) -> dict[str, float]:
    return {
        p.attributes[names.ATTR_GEN_AI_UNPARSABLE_REASON]: float(p.value or 0)
        for p in points(telemetry, names.METRIC_GEN_AI_CLIENT_UNPARSABLE)
    }


def outcomes(telemetry: Capture) -> dict[str, int]:
    return {
        p.attributes[names.ATTR_GEN_AI_OUTCOME]: p.count
        for p in points(telemetry, names.METRIC_GEN_AI_CLIENT_OPERATION_DURATION)
    }


async def read_stream(response: aiohttp.ClientResponse) -> list[bytes]:
    return [data async for data in iter_sse_data(response)]


def event_data(chunks: list[bytes]) -> list[bytes]:
    """The data of each complete event on the wire (what iter_sse_data must yield; a cut one is not)."""
    blocks = b"".join(chunks).split(b"\n\n")[:-1]
    return [line[6:] for block in blocks for line in block.split(b"\n") if line.startswith(b"data: ")]


@pytest.mark.parametrize("operation", OPERATIONS)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_the_client_span_carries_what_the_server_span_got(
    client: ServerClient, telemetry: Capture, operation: str, stream: bool
) -> None:
    response = await post(client, operation, stream=stream)
    assert client_spans(telemetry, operation) == []  # open until the reply is read
    if stream:
        assert await read_stream(response) == event_data(stream_chunks(operation, "ok"))
    else:
        assert await get_response_json(response) == orjson.loads(json_body(operation, "ok"))
    response.release()
    (span,) = client_spans(telemetry, operation)
    (server,) = wait_for(lambda: [s for s in telemetry.spans() if s.kind is SpanKind.SERVER])
    assert server.parent is not None and server.parent.span_id == span.context.span_id
    mine, theirs = dict(span.attributes or {}), dict(server.attributes or {})
    for key in (
        names.ATTR_GEN_AI_OPERATION_NAME,
        names.ATTR_GEN_AI_PROVIDER_NAME,
        names.ATTR_GEN_AI_REQUEST_MODEL,
        names.ATTR_GEN_AI_RESPONSE_MODEL,
        names.ATTR_GEN_AI_RESPONSE_ID,
        names.ATTR_GEN_AI_USAGE_INPUT_TOKENS,
        names.ATTR_GEN_AI_USAGE_OUTPUT_TOKENS,
        names.ATTR_GEN_AI_USAGE_CACHED_INPUT_TOKENS,
        names.ATTR_GEN_AI_RESPONSE_FINISH_REASONS,
        names.ATTR_GEN_AI_OUTCOME,
        names.ATTR_GEN_AI_STREAMED,
    ):
        assert mine.get(key) == theirs.get(key) and key in mine, key
    assert (
        mine[names.ATTR_GEN_AI_USAGE_INPUT_TOKENS] == 11 and mine[names.ATTR_GEN_AI_PROVIDER_NAME] == "openai"
    )
    assert mine[names.ATTR_HTTP_RESPONSE_STATUS_CODE] == 200 and span.status.is_ok
    first = [e for e in span.events if e.name == names.SPAN_EVENT_GEN_AI_FIRST_TOKEN]
    assert len(first) == int(stream)
    base = {
        names.ATTR_GEN_AI_OPERATION_NAME: operation,
        names.ATTR_GEN_AI_PROVIDER_NAME: "openai",
        names.ATTR_GEN_AI_REQUEST_MODEL: MODEL,
        names.ATTR_SERVER_ADDRESS: "127.0.0.1",
        names.ATTR_SERVER_PORT: PORT,
        names.ATTR_SERVER_NAME: SERVER,
    }
    (duration,) = points(telemetry, names.METRIC_GEN_AI_CLIENT_OPERATION_DURATION)
    assert duration.attributes == {**base, names.ATTR_GEN_AI_OUTCOME: "ok"}
    assert duration.count == 1 and duration.explicit_bounds == names.GEN_AI_DURATION_BUCKETS_S
    assert telemetry.metric_unit(names.METRIC_GEN_AI_CLIENT_OPERATION_DURATION) == "s"
    assert token_sums(telemetry) == TOKENS
    (tokens, *_) = points(telemetry, names.METRIC_GEN_AI_CLIENT_TOKEN_USAGE)
    assert tokens.explicit_bounds == tuple(float(b) for b in names.GEN_AI_TOKEN_BUCKETS)
    assert telemetry.metric_unit(names.METRIC_GEN_AI_CLIENT_TOKEN_USAGE) == "{token}"
    ttfc = points(telemetry, names.METRIC_GEN_AI_CLIENT_TIME_TO_FIRST_CHUNK)
    if stream:
        (point,) = ttfc
        assert point.attributes == base and 0 < point.sum <= duration.sum
        assert point.explicit_bounds == names.GEN_AI_TTFT_BUCKETS_S
    else:
        assert ttfc == []
    assert unparsable(telemetry) == {}


def _recorded_points(telemetry: Capture, caller: int) -> list[tuple[Any, ...]]:
    """Every client GenAI point: labels, count, token sums and buckets (a duration's count only: the rest
    is time), and the spans its exemplars point to (``caller``'s span id shown as "caller")."""
    seen = []
    for metric in (names.METRIC_GEN_AI_CLIENT_OPERATION_DURATION, names.METRIC_GEN_AI_CLIENT_TOKEN_USAGE):
        for p in points(telemetry, metric):
            timed = metric == names.METRIC_GEN_AI_CLIENT_OPERATION_DURATION
            values = (p.count,) if timed else (p.count, p.sum, p.bucket_counts, p.min, p.max)
            spans = {"caller" if span_id == caller else span_id for span_id in p.exemplar_spans}
            seen.append((metric, sorted(p.attributes.items()), *values, spans))
    return sorted(seen, key=repr)


@pytest.mark.parametrize("operation", OPERATIONS)
async def test_a_usual_call_records_what_the_general_steps_record(
    client: ServerClient, telemetry: Capture, operation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole reply with both counts and nothing else is recorded in one step: the same points, each
    with an exemplar of the caller's span, as the general steps record."""
    from gym_obs.client import model_calls

    taken: list[bool] = []
    usual_points = model_calls._usual_points  # type: ignore[attr-defined]

    def watched(*args: Any) -> Any:
        found = usual_points(*args)
        taken.append(found is not None)
        return found

    seen = []
    caller = telemetry.tracer_provider.get_tracer("test")
    for one_step in (True, False):
        monkeypatch.setattr(model_calls, "_usual_points", watched if one_step else lambda *args: None)
        telemetry.clear()
        with caller.start_as_current_span("caller") as span:
            for _ in range(3):
                await get_response_json(await post(client, operation, "plain"))
        seen.append(_recorded_points(telemetry, span.get_span_context().span_id))
        assert all(point[-1] == {"caller"} for point in seen[-1])  # every point has the caller's exemplar
    assert taken == [True] * 3  # the one step ran, for every call
    assert seen[0] == seen[1]
    assert {point[0] for point in seen[0]} == {
        names.METRIC_GEN_AI_CLIENT_OPERATION_DURATION, names.METRIC_GEN_AI_CLIENT_TOKEN_USAGE
    }
    assert token_sums(telemetry) == {"input": 3 * TOKENS["input"], "output": 3 * TOKENS["output"]}


@pytest.mark.parametrize("operation", OPERATIONS)
@pytest.mark.parametrize(("scenario", "stream", "reason"), HOSTILE)
async def test_hostile_replies_reach_the_caller_whole_and_count_once(
    client: ServerClient, telemetry: Capture, operation: str, scenario: str, stream: bool, reason: str
) -> None:
    response = await post(client, operation, scenario, stream)
    if stream:
        assert await read_stream(response) == event_data(stream_chunks(operation, scenario))
    elif scenario == "malformed":
        with pytest.raises(ResponseJSONError):  # the caller's own parse fails, as it would without telemetry
            await get_response_json(response)
    else:
        assert await get_response_json(response) == orjson.loads(json_body(operation, scenario))
    attributes = one_client_span(telemetry, operation)
    assert attributes[names.ATTR_GEN_AI_UNPARSABLE_REASON] == reason
    assert unparsable(telemetry) == {reason: 1.0}
    assert outcomes(telemetry) == {"ok": 1}
    assert all(count >= 0 for count in token_sums(telemetry).values())


async def test_a_50_mb_reply_arrives_whole_and_only_its_usage_is_skipped(
    client: ServerClient, telemetry: Capture
) -> None:
    response = await post(client, names.GEN_AI_OPERATION_CHAT, "huge")
    reply = await get_response_json(response)
    assert reply == orjson.loads(json_body(names.GEN_AI_OPERATION_CHAT, "huge"))
    assert unparsable(telemetry) == {"too_large": 1.0} and token_sums(telemetry) == {}
    assert outcomes(telemetry) == {"ok": 1}


async def test_a_50_mb_event_arrives_whole(client: ServerClient, telemetry: Capture) -> None:
    """One event of 50 MB: over the telemetry parser's limit (skipped, counted), under the reader's."""
    operation = names.GEN_AI_OPERATION_CHAT
    response = await post(client, operation, "huge_event", stream=True)
    assert await read_stream(response) == event_data(stream_chunks(operation, "huge_event"))
    assert unparsable(telemetry) == {"too_large": 1.0}
    assert outcomes(telemetry) == {"ok": 1} and token_sums(telemetry) == TOKENS


async def test_an_error_reply_ends_the_span_at_once(client: ServerClient, telemetry: Capture) -> None:
    operation = names.GEN_AI_OPERATION_RESPONSES
    response = await post(client, operation, "error")
    assert response.status == 503
    attributes = one_client_span(telemetry, operation)  # before anyone read the body
    assert attributes[names.ATTR_GEN_AI_OUTCOME] == "upstream_error"
    assert attributes[names.ATTR_ERROR_TYPE] == "503"
    (duration,) = points(telemetry, names.METRIC_GEN_AI_CLIENT_OPERATION_DURATION)
    assert duration.attributes[names.ATTR_ERROR_TYPE] == "503"
    response.release()
    assert unparsable(telemetry) == {} and token_sums(telemetry) == {}


async def test_a_request_that_raises_ends_its_call(client: ServerClient, telemetry: Capture) -> None:
    url = f"http://127.0.0.1:{PORT + 3}{names.GEN_AI_ROUTE_CHAT}"  # nothing listens there
    with rollout_scope("r-raise") as tally, pytest.raises(aiohttp.ClientConnectionError):
        await request("POST", url, json={"model": MODEL}, _max_num_tries=1)
    (span,) = [s for s in telemetry.spans("POST") if s.kind is SpanKind.CLIENT]
    attributes = dict(span.attributes or {})
    assert attributes[names.ATTR_GEN_AI_OUTCOME] == "exception" and not span.status.is_ok
    assert attributes[names.ATTR_GEN_AI_REQUEST_MODEL] == MODEL
    (duration,) = points(telemetry, names.METRIC_GEN_AI_CLIENT_OPERATION_DURATION)
    assert duration.attributes[names.ATTR_ERROR_TYPE] == span.attributes[names.ATTR_ERROR_TYPE]  # type: ignore[index]
    assert tally.summary()["model_calls"] == 1


async def test_a_reply_never_read_ends_when_dropped(client: ServerClient, telemetry: Capture) -> None:
    operation = names.GEN_AI_OPERATION_MESSAGES
    response = await post(client, operation)
    await asyncio.sleep(0.05)
    assert client_spans(telemetry, operation) == []
    del response
    gc.collect()
    attributes = one_client_span(telemetry, operation)
    assert attributes[names.ATTR_GEN_AI_OUTCOME] == "ok"
    assert attributes[names.ATTR_GEN_AI_UNPARSABLE_REASON] == names.GEN_AI_UNPARSABLE_UNREAD
    assert unparsable(telemetry) == {"unread": 1.0} and token_sums(telemetry) == {}


async def test_a_reply_read_with_plain_aiohttp_gets_its_facts_or_ends_when_let_go(
    client: ServerClient, telemetry: Capture
) -> None:
    operation = names.GEN_AI_OPERATION_CHAT
    response = await post(client, operation)
    async with response:  # aiohttp's own json() reads through the response's read(): the facts are read
        assert await response.json() == orjson.loads(json_body(operation, "ok"))
    attributes = one_client_span(telemetry, operation)
    assert attributes[names.ATTR_GEN_AI_USAGE_INPUT_TOKENS] == 11 and token_sums(telemetry) == TOKENS
    whole = await post(client, operation, stream=True)
    assert (await whole.text()).encode() == b"".join(stream_chunks(operation, "ok"))  # a stream read whole
    assert len(wait_for(lambda: client_spans(telemetry, operation), 2)) == 2
    assert unparsable(telemetry) == {} and token_sums(telemetry)["input"] == 22
    by_hand = await post(client, operation, stream=True)
    assert b"".join([chunk async for chunk in by_hand.content.iter_any()]) == b"".join(
        stream_chunks(operation, "ok")
    )
    by_hand.release()  # after the last byte: no connection callback, the release itself says so
    unread = await post(client, operation)
    await asyncio.sleep(0.05)
    unread.close()
    spans = wait_for(lambda: client_spans(telemetry, operation), 4)
    assert [(s.attributes or {})[names.ATTR_GEN_AI_OUTCOME] for s in spans] == ["ok"] * 4
    assert unparsable(telemetry) == {"unread": 2.0}


async def test_a_response_nobody_keeps_is_read_whole(client: ServerClient, telemetry: Capture) -> None:
    """``await (await post(...)).read()``: the caller holds no reference to the response while it reads."""
    operation = names.GEN_AI_OPERATION_CHAT
    body = await (await post(client, operation)).read()
    assert orjson.loads(body) == orjson.loads(json_body(operation, "ok"))
    assert one_client_span(telemetry, operation)[names.ATTR_GEN_AI_USAGE_INPUT_TOKENS] == 11
    assert token_sums(telemetry) == TOKENS
    (await post(client, operation)).release()  # let go at once: the call ends, whatever it was told
    spans = wait_for(lambda: client_spans(telemetry, operation), 2)
    assert len(spans) == 2
    assert (spans[1].attributes or {})[names.ATTR_GEN_AI_OUTCOME] in {"ok", "cancelled"}


async def test_a_stream_released_early_ends_at_once_as_cancelled(
    client: ServerClient, telemetry: Capture
) -> None:
    operation = names.GEN_AI_OPERATION_RESPONSES
    response = await post(client, operation, "slow", stream=True)
    assert await response.content.readany()
    response.release()  # no garbage collection needed: the connection's release tells
    attributes = one_client_span(telemetry, operation)
    assert attributes[names.ATTR_GEN_AI_OUTCOME] == "cancelled"
    assert outcomes(telemetry) == {"cancelled": 1} and unparsable(telemetry) == {}
    closed = await post(client, operation, "slow", stream=True)
    closed.close()
    assert len(wait_for(lambda: client_spans(telemetry, operation), 2)) == 2


@pytest.mark.parametrize("how", ["cancel", "break"])
async def test_a_stream_given_up_midway_is_cancelled_with_its_first_token(
    client: ServerClient, telemetry: Capture, how: str
) -> None:
    operation = names.GEN_AI_OPERATION_CHAT
    first = asyncio.Event()

    async def consume(response: aiohttp.ClientResponse) -> None:
        reader = iter_sse_data(response)
        async for data in reader:
            if b"w0" in data:
                first.set()
                if how == "break":
                    await reader.aclose()
                    return

    with rollout_scope("r-cancel") as tally:
        response = await post(client, operation, "slow", stream=True)
        task = asyncio.ensure_future(consume(response))
        await first.wait()
        if how == "cancel":
            task.cancel()
        with pytest.raises(asyncio.CancelledError) if how == "cancel" else _nothing():
            await task
        (span,) = client_spans(telemetry, operation)
        response.release()
    attributes = dict(span.attributes or {})
    assert attributes[names.ATTR_GEN_AI_OUTCOME] == "cancelled" and span.status.is_ok
    assert [e.name for e in span.events] == [names.SPAN_EVENT_GEN_AI_FIRST_TOKEN]
    assert tally.model_calls == 1 and tally.input_tokens == 0 and tally.ttfts == []


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


async def test_the_rollout_tally_is_fed_by_the_helpers(client: ServerClient, telemetry: Capture) -> None:
    async def call(operation: str, stream: bool) -> None:
        response = await post(client, operation, stream=stream)
        if stream:
            await read_stream(response)
        else:
            await get_response_json(response)

    with rollout_scope("r-tally") as tally:
        await call(names.GEN_AI_OPERATION_CHAT, False)
        await asyncio.gather(*(call(op, True) for op in OPERATIONS))
        resources = await client.post(SERVER, "/v1/embeddings", json={"operation": "chat"})
        await get_response_json(resources)  # not a model call: not counted
    summary = tally.summary()
    assert summary["model_calls"] == 4
    assert (summary["input_tokens"], summary["output_tokens"]) == (44, 28)
    assert len(tally.ttfts) == 3 and 0 < summary["ttft_p50_s"] <= summary["model_time_s"]
    rollout = telemetry.spans(names.SPAN_ROLLOUT)[0]
    assert (rollout.attributes or {})[names.ATTR_ROLLOUT_INPUT_TOKENS] == 44


async def test_routes_targets_and_unlisted_models(client: ServerClient, telemetry: Capture) -> None:
    base = f"http://127.0.0.1:{PORT}"
    embeddings = await request("POST", base + "/v1/embeddings", json={"operation": "chat"})
    embeddings.release()
    span = wait_for(lambda: [s for s in telemetry.spans("POST") if s.kind is SpanKind.CLIENT])[0]
    assert names.ATTR_GEN_AI_OPERATION_NAME not in (span.attributes or {})
    body = {"operation": "chat", "model": "secret-finetune-123"}
    prefixed = base + "/ng-rollout/r-1" + names.GEN_AI_ROUTE_CHAT + "?x=1"
    allow = ModelCallTarget(provider="vllm", model_allow_list=frozenset({MODEL}))
    await get_response_json(await request("POST", prefixed, json=body, _model_call=allow))
    (duration,) = points(telemetry, names.METRIC_GEN_AI_CLIENT_OPERATION_DURATION)
    assert duration.attributes[names.ATTR_GEN_AI_REQUEST_MODEL] == names.GEN_AI_MODEL_OTHER
    assert duration.attributes[names.ATTR_GEN_AI_PROVIDER_NAME] == "vllm"
    model_spans = [
        s for s in telemetry.spans("POST") if names.ATTR_GEN_AI_OPERATION_NAME in (s.attributes or {})
    ]
    assert (model_spans[0].attributes or {})[names.ATTR_GEN_AI_REQUEST_MODEL] == "secret-finetune-123"
    plain = await request("POST", base + names.GEN_AI_ROUTE_CHAT, json=body)  # no target: no model label
    await get_response_json(plain)
    labels = [p.attributes for p in points(telemetry, names.METRIC_GEN_AI_CLIENT_OPERATION_DURATION)]
    assert any(names.ATTR_GEN_AI_REQUEST_MODEL not in a for a in labels)
    opted_out = await request("POST", base + names.GEN_AI_ROUTE_CHAT, json=body, _model_call=NOT_A_MODEL_CALL)
    await get_response_json(opted_out)
    assert len(points(telemetry, names.METRIC_GEN_AI_CLIENT_OPERATION_DURATION)) == 2


async def test_with_telemetry_off_nothing_is_recorded_and_the_rollout_still_counts(
    client: ServerClient, telemetry: Capture
) -> None:
    state = telemetry_state()
    snapshot = state.snapshot()
    state.enabled = False
    try:
        with rollout_scope("r-off") as tally:
            response = await post(client, names.GEN_AI_OPERATION_CHAT, stream=True)
            assert await read_stream(response) == event_data(stream_chunks(names.GEN_AI_OPERATION_CHAT, "ok"))
            reply = await get_response_json(await post(client, names.GEN_AI_OPERATION_CHAT))
            failed = await post(client, names.GEN_AI_OPERATION_CHAT, "error")
            failed.release()
        assert reply["usage"]["prompt_tokens"] == 11
        # The rollout's own report still has its model calls; nothing went to a span or a metric.
        summary = tally.summary()
        assert summary["model_calls"] == 3
        assert (summary["input_tokens"], summary["output_tokens"]) == (22, 14)
        assert len(tally.ttfts) == 1
        outside = await post(client, names.GEN_AI_OPERATION_CHAT)  # outside a rollout: nothing at all
        assert await outside.read()
        assert outside.__class__ is aiohttp.ClientResponse
    finally:
        state.restore(snapshot)
    assert client_spans(telemetry, names.GEN_AI_OPERATION_CHAT) == []
    assert points(telemetry, names.METRIC_GEN_AI_CLIENT_OPERATION_DURATION) == []


async def test_a_body_read_inside_request_ends_the_call_with_the_whole_http_span(
    client: ServerClient, telemetry: Capture
) -> None:
    """``_read_body=True``: the reply is read inside request(), so the call ends at once, after the observer
    gave the span its status (and, for a retried request, its resend count)."""
    operation = names.GEN_AI_OPERATION_CHAT
    payload = {"operation": operation, "scenario": "ok", "model": MODEL}
    response = await client.post(
        SERVER, ROUTES[operation], json=payload, _route=ROUTES[operation], _read_body=True
    )
    attributes = one_client_span(telemetry, operation)  # ended before anyone read the reply
    assert attributes[names.ATTR_HTTP_RESPONSE_STATUS_CODE] == 200
    assert attributes[names.ATTR_GEN_AI_USAGE_INPUT_TOKENS] == 11
    assert (await get_response_json(response))["usage"]["prompt_tokens"] == 11
    assert token_sums(telemetry) == TOKENS  # read once, not twice
