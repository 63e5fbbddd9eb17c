"""with_rollout_prefix and the httpx request hooks: which URLs get /ng-rollout (and /ng-trace) and which
don't."""

from __future__ import annotations

import asyncio
import contextvars
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gym_obs.telemetry.propagation import (
    async_rollout_prefix_hook,
    parse_path_segments,
    rollout_context,
    rollout_prefix_hook,
    trace_context_path_segment,
    with_rollout_prefix,
)
from gym_obs.telemetry.spans import client_span
from gym_obs.telemetry.testing import Capture

BASE = "http://model.local:8000"


@pytest.mark.parametrize(
    ("url", "bases", "expected"),
    [
        # inserted right after the base; query and fragment kept
        (f"{BASE}/v1/chat?x=1#f", [BASE], f"{BASE}/ng-rollout/r1/v1/chat?x=1#f"),
        (BASE, [BASE], f"{BASE}/ng-rollout/r1"),
        (f"{BASE}/", [BASE], f"{BASE}/ng-rollout/r1/"),
        # a base with a path: whole segments, inserted after it
        ("http://gw/model-a/v1/x", ["http://gw/model-a"], "http://gw/model-a/ng-rollout/r1/v1/x"),
        ("http://gw/model-a/v1/x", ["http://gw/model-a/"], "http://gw/model-a/ng-rollout/r1/v1/x"),
        ("http://gw/model-a", ["http://gw/model-a"], "http://gw/model-a/ng-rollout/r1"),
        ("http://gw/model-ab/v1", ["http://gw/model-a"], "http://gw/model-ab/v1"),
        ("http://gw/v10/x", ["http://gw/v1"], "http://gw/v10/x"),
        ("http://gw/Model-A/x", ["http://gw/model-a"], "http://gw/Model-A/x"),  # paths are case-sensitive
        # the longest matching base wins
        ("http://gw/a/b/c", ["http://gw", "http://gw/a/b", "http://gw/a"], "http://gw/a/b/ng-rollout/r1/c"),
        # host is case-insensitive; effective ports
        ("http://MODEL.local:8000/v1", [BASE], f"{BASE.replace('model', 'MODEL')}/ng-rollout/r1/v1"),
        ("http://h/v1", ["http://h:80"], "http://h/ng-rollout/r1/v1"),
        ("http://h:80/v1", ["http://h"], "http://h:80/ng-rollout/r1/v1"),
        ("https://h/v1", ["https://h:443"], "https://h/ng-rollout/r1/v1"),
        ("https://h:8443/v1", ["https://h"], "https://h:8443/v1"),
        ("http://h:81/v1", ["http://h"], "http://h:81/v1"),
        # scheme must match
        ("https://model.local:8000/v1", [BASE], "https://model.local:8000/v1"),
        # other hosts left alone
        ("http://api.openai.com/v1", [BASE], "http://api.openai.com/v1"),
        ("http://model.local.evil:8000/v1", [BASE], "http://model.local.evil:8000/v1"),
        # IPv6
        ("http://[::1]:9000/v1", ["http://[::1]:9000"], "http://[::1]:9000/ng-rollout/r1/v1"),
        ("http://[::1]:9001/v1", ["http://[::1]:9000"], "http://[::1]:9001/v1"),
        # already prefixed: left alone
        (f"{BASE}/ng-rollout/r0/v1", [BASE], f"{BASE}/ng-rollout/r0/v1"),
        (f"{BASE}/ng-rollout", [BASE], f"{BASE}/ng-rollout"),
        (
            f"{BASE}/ng-trace/00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01/v1",
            [BASE],
            f"{BASE}/ng-trace/00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01/v1",
        ),
        # a base that already carries the prefix (a subprocess agent's URL): nothing is added
        (f"{BASE}/ng-rollout/r0/v1/chat", [f"{BASE}/ng-rollout/r0"], f"{BASE}/ng-rollout/r0/v1/chat"),
        # a single string is one base; garbage bases are ignored
        (f"{BASE}/v1", BASE, f"{BASE}/ng-rollout/r1/v1"),
        (f"{BASE}/v1", ["not a url", "http://[bad", BASE], f"{BASE}/ng-rollout/r1/v1"),
        ("http://[bad/v1", [BASE], "http://[bad/v1"),
        # credentials in the authority are kept as they are
        ("http://u:p@model.local:8000/v1", [BASE], "http://u:p@model.local:8000/ng-rollout/r1/v1"),
    ],
)
def test_with_rollout_prefix(url: str, bases: list[str] | str, expected: str) -> None:
    with rollout_context("r1"):
        assert with_rollout_prefix(url, bases) == expected


def test_outside_a_rollout_nothing_changes(telemetry: Capture) -> None:
    with client_span("GET"):
        assert with_rollout_prefix(f"{BASE}/v1", [BASE]) == f"{BASE}/v1"


def test_rollout_id_is_percent_encoded() -> None:
    with rollout_context("a/b c"):
        assert with_rollout_prefix(f"{BASE}/v1", [BASE]) == f"{BASE}/ng-rollout/a%2Fb%20c/v1"


def test_trace_segment_follows_while_traces_export(telemetry: Capture) -> None:
    with rollout_context("r1"):
        assert with_rollout_prefix(f"{BASE}/v1", [BASE]) == f"{BASE}/ng-rollout/r1/v1"  # no span yet
        with client_span("GET"):
            segment = trace_context_path_segment()
            url = with_rollout_prefix(f"{BASE}/v1", [BASE])
    assert segment
    assert url == f"{BASE}/ng-rollout/r1{segment}/v1"
    parsed = parse_path_segments(url.removeprefix(BASE))
    assert (parsed.path, parsed.rollout_id, parsed.traceparent) == ("/v1", "r1", segment[len("/ng-trace/") :])


def test_no_trace_segment_when_telemetry_is_off() -> None:
    with rollout_context("r1"), client_span("GET"):
        assert with_rollout_prefix(f"{BASE}/v1", [BASE]) == f"{BASE}/ng-rollout/r1/v1"


_segment = st.text(alphabet="abcXYZ019-_.~%", min_size=1, max_size=6)


@given(
    base_path=st.lists(_segment, max_size=3),
    rest=st.lists(_segment, max_size=3),
    rollout=st.text(min_size=1, max_size=20).filter(str.isprintable),
    trailing=st.booleans(),
)
def test_prefixed_urls_parse_back(
    base_path: list[str], rest: list[str], rollout: str, trailing: bool
) -> None:
    base = "http://h:1" + "".join("/" + seg for seg in base_path)
    tail = "".join("/" + seg for seg in rest) + ("/" if trailing and rest else "")
    url = base + tail + "?q=1"
    with rollout_context(rollout):
        prefixed = with_rollout_prefix(url, [base])
        assert with_rollout_prefix(prefixed, [base]) == prefixed  # idempotent
    gym = ("ng-rollout", "ng-trace")
    if any(seg in gym for seg in base_path) or (rest and rest[0] in gym):
        return
    head = "http://h:1" + "".join("/" + seg for seg in base_path)
    assert prefixed.startswith(head + "/ng-rollout/")
    parsed = parse_path_segments(prefixed[len(head) :].removesuffix("?q=1"))
    assert parsed.rollout_id == rollout
    assert parsed.path == (tail or "/")


# --- httpx hooks --------------------------------------------------------------------------------------------


def _echo(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"url": str(request.url), "host": request.headers["host"]})


def test_sync_hook_rewrites_matching_requests() -> None:
    hook = rollout_prefix_hook([BASE])
    with httpx.Client(transport=httpx.MockTransport(_echo), event_hooks={"request": [hook]}) as client:
        assert client.get(f"{BASE}/v1/x?y=2").json()["url"] == f"{BASE}/v1/x?y=2"
        with rollout_context("r1"):
            reply = client.get(f"{BASE}/v1/x?y=2").json()
            other = client.get("http://api.openai.com/v1/x").json()
    assert reply == {"url": f"{BASE}/ng-rollout/r1/v1/x?y=2", "host": "model.local:8000"}
    assert other["url"] == "http://api.openai.com/v1/x"


async def test_async_hook_rewrites_matching_requests() -> None:
    hook = async_rollout_prefix_hook(BASE)
    transport = httpx.MockTransport(_echo)
    async with httpx.AsyncClient(transport=transport, event_hooks={"request": [hook]}) as client:
        with rollout_context("r2"):
            reply = (await client.post(f"{BASE}/v1/responses", json={})).json()
    assert reply["url"] == f"{BASE}/ng-rollout/r2/v1/responses"


async def test_context_variable_caveat_to_thread_vs_thread_pool() -> None:
    hook = rollout_prefix_hook([BASE])
    client = httpx.Client(transport=httpx.MockTransport(_echo), event_hooks={"request": [hook]})

    def call() -> str:
        return str(client.get(f"{BASE}/v1").json()["url"])

    with client, rollout_context("r3"), ThreadPoolExecutor(1) as pool:
        assert await asyncio.to_thread(call) == f"{BASE}/ng-rollout/r3/v1"
        assert pool.submit(call).result() == f"{BASE}/v1"  # the pool thread does not see the rollout
        assert pool.submit(contextvars.copy_context().run, call).result() == f"{BASE}/ng-rollout/r3/v1"
