"""DisconnectCancelMiddleware driven directly through ASGI: cancel on an early disconnect, and only then."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from typing import Any

import pytest

from gym_obs.server import DisconnectCancelMiddleware, FailureReplyMiddleware

Message = dict[str, Any]
SCOPE: dict[str, Any] = {"type": "http", "path": "/slow", "method": "POST", "headers": []}
# (a fresh copy per request, as an ASGI server gives each request its own scope: layers keep state in it)
START: Message = {"type": "http.response.start", "status": 200, "headers": []}
BODY: Message = {"type": "http.response.body", "body": b"done"}


class _Peer:
    """The server side of one connection: body parts, then a disconnect when ``hang_up()`` is called."""

    def __init__(self, *parts: bytes) -> None:
        self.messages = [
            {"type": "http.request", "body": part, "more_body": i < len(parts) - 1}
            for i, part in enumerate(parts)
        ] or [{"type": "http.request", "body": b"", "more_body": False}]
        self.gone = asyncio.Event()
        self.sent: list[Message] = []

    async def receive(self) -> Message:
        if self.messages:
            return self.messages.pop(0)
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    def hang_up(self) -> None:
        self.gone.set()


async def _run(app: Any, peer: _Peer, hang_up_after: float | None) -> asyncio.Task[None]:
    middleware = DisconnectCancelMiddleware(app, watch_delay_s=0.01)
    task = asyncio.create_task(middleware(dict(SCOPE), peer.receive, peer.send))
    if hang_up_after is not None:
        await asyncio.sleep(hang_up_after)
        peer.hang_up()
    await asyncio.wait_for(asyncio.shield(task), 2)
    return task


async def test_disconnect_before_the_reply_cancels_the_handler_and_nothing_is_sent() -> None:
    events: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        assert (await receive())["body"] == b'{"a": 1}'
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            events.append("cancelled")
            await send(START)  # a handler that still tries to answer: dropped
            raise

    peer = _Peer(b'{"a": 1}')
    task = await _run(app, peer, hang_up_after=0.05)
    assert events == ["cancelled"]
    assert peer.sent == []
    assert not task.cancelled()  # the request task itself ends normally


async def test_a_handler_that_never_reads_the_body_is_cancelled_too_and_can_still_read_it() -> None:
    events: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await asyncio.sleep(0.03)  # the watcher has taken over receive by now
        events.append(await receive())
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            events.append("cancelled")
            raise

    peer = _Peer(b"part1", b"part2")
    await _run(app, peer, hang_up_after=0.1)
    assert events[0] == {"type": "http.request", "body": b"part1", "more_body": True}
    assert events[-1] == "cancelled"


async def test_disconnect_after_the_reply_started_does_not_cancel() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send(START)
        await asyncio.sleep(0.1)
        await send(BODY)

    peer = _Peer(b"")
    await _run(app, peer, hang_up_after=0.03)
    assert peer.sent == [START, BODY]


async def test_fast_handlers_pass_through_untouched() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send(START)
        await send(BODY)

    peer = _Peer(b"x")
    await _run(app, peer, hang_up_after=None)
    assert peer.sent == [START, BODY]


async def test_the_app_that_waits_for_the_disconnect_itself_sees_it() -> None:
    seen: list[Message] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(await receive())
        seen.append(await receive())  # blocks until the peer hangs up, like StreamingResponse does

    peer = _Peer(b"x")
    await _run(app, peer, hang_up_after=0.05)
    assert seen[-1] == {"type": "http.disconnect"}


async def test_a_handler_that_swallows_the_cancellation_leaves_no_pending_cancel() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(10)
        await send(START)  # dropped: the caller is gone

    peer = _Peer(b"")
    task = await _run(app, peer, hang_up_after=0.05)
    assert peer.sent == []
    assert task.done() and not task.cancelled()


async def test_server_shutdown_cancellation_still_propagates() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await asyncio.sleep(10)

    peer = _Peer(b"")
    middleware = DisconnectCancelMiddleware(app, watch_delay_s=0.01)
    task = asyncio.create_task(middleware(dict(SCOPE), peer.receive, peer.send))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_non_http_scopes_pass_through() -> None:
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    await DisconnectCancelMiddleware(app)({"type": "lifespan"}, _Peer().receive, _Peer().send)
    assert seen == ["lifespan"]


async def test_an_error_raised_after_the_disconnect_is_not_answered() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    peer = _Peer(b"")
    middleware = FailureReplyMiddleware(DisconnectCancelMiddleware(app, watch_delay_s=0.01), boundary="agent")
    task = asyncio.create_task(middleware(dict(SCOPE), peer.receive, peer.send))
    await asyncio.sleep(0.05)
    peer.hang_up()
    await asyncio.wait_for(task, 2)
    assert peer.sent == []


class _Protocol:
    """Like uvicorn's connection protocol: it keeps its server's set of running request tasks."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()

    def on_response_complete(self) -> None:
        return None


class _PolledPeer(_Peer):
    """Like uvicorn's request cycle: flags the transport sets, which the layer polls (no watcher task), and
    ``on_response``, a method of its protocol; :meth:`start` runs a request as uvicorn does."""

    def __init__(self, scope: dict[str, Any], protocol: _Protocol) -> None:
        super().__init__()
        self.scope = scope
        self.disconnected = False
        self.response_started = False
        self.on_response = protocol.on_response_complete

    async def run_asgi(self, app: Any) -> None:
        await app(self.scope, self.receive, self.send)

    def start(self, app: Any) -> asyncio.Task[None]:
        task = asyncio.create_task(self.run_asgi(app))
        tasks = self.on_response.__self__.tasks  # type: ignore[attr-defined]
        task.add_done_callback(tasks.discard)
        tasks.add(task)
        return task

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.response_started = True
        await super().send(message)

    def hang_up(self) -> None:
        self.disconnected = True
        super().hang_up()


async def _polled_request(
    middleware: Any, events: list[str], hang_up: bool, protocol: _Protocol
) -> _PolledPeer:
    """One request on the running loop: a fast one is answered, a hung-up one is cancelled."""
    peer = _PolledPeer(dict(SCOPE), protocol)
    task = peer.start(middleware)
    if hang_up:
        await asyncio.sleep(0.05)
        peer.hang_up()
    await asyncio.wait_for(asyncio.shield(task), 2)
    assert not task.cancelled()
    events.append("cancelled" if peer.sent == [] else "answered")
    return peer


async def _slow_or_fast(scope: Any, receive: Any, send: Any) -> None:
    assert isinstance(receive.__self__, _PolledPeer)  # polled: the app reads uvicorn's own receive
    if scope["path"] == "/slow":
        await asyncio.sleep(10)
    await send(START)
    await send(BODY)


async def _one_server(middleware: Any, events: list[str], protocol: _Protocol | None = None) -> None:
    """A server (its own task set, unless ``protocol`` gives one) on the running loop: a slow request hangs
    up while a fast one is answered."""
    protocol = protocol or _Protocol()
    slow = asyncio.create_task(_polled_request(middleware, events, hang_up=True, protocol=protocol))
    peer = _PolledPeer({**SCOPE, "path": "/fast"}, protocol)
    await peer.start(middleware)  # answered while the slow one is in flight
    events.append("answered" if peer.sent == [START, BODY] else "lost")
    await slow


def test_polled_requests_are_cancelled_on_each_loop_and_thread_the_layer_serves() -> None:
    """The layer finds a request's server by its task set: a request of a server on a new loop, or on a
    loop in another thread, is still the one cancelled, as on the first loop."""
    middleware = DisconnectCancelMiddleware(_slow_or_fast, watch_delay_s=0.01)
    events: list[str] = []
    asyncio.run(_one_server(middleware, events))
    asyncio.run(_one_server(middleware, events))  # a new loop on the same thread
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, _one_server(middleware, events)).result(timeout=10)  # another thread
    asyncio.run(_one_server(middleware, events))  # back on the first thread
    assert events == ["answered", "cancelled"] * 4


def test_a_server_serving_again_on_a_new_loop_is_swept_there() -> None:
    """A uvicorn server object run twice keeps its task set; the second run's loop gets the sweeper."""
    middleware = DisconnectCancelMiddleware(_slow_or_fast, watch_delay_s=0.01)
    events: list[str] = []
    protocol = _Protocol()
    asyncio.run(_one_server(middleware, events, protocol))
    asyncio.run(_one_server(middleware, events, protocol))
    assert events == ["answered", "cancelled"] * 2


def test_servers_on_one_loop_and_on_two_threads_at_once_are_each_swept_once() -> None:
    """Two servers on one loop, and the same layer serving on two threads at the same time: every hung-up
    request is cancelled, by one sweeper (a second one would cancel it again, and the request would end
    with a ``CancelledError`` the layer does not absorb)."""
    middleware = DisconnectCancelMiddleware(_slow_or_fast, watch_delay_s=0.01)
    events: list[str] = []

    async def sweepers_here() -> int:
        """Fast requests while both servers' slow ones are in flight (the other thread's too), then the
        number of sweepers on this loop."""
        protocol = _Protocol()
        for _ in range(10):
            await _PolledPeer({**SCOPE, "path": "/fast"}, protocol).start(middleware)
            await asyncio.sleep(0.002)
        return sum(task.get_coro().__qualname__ == "_Sweeper._sweep" for task in asyncio.all_tasks())

    async def two_servers() -> None:
        *_, sweepers = await asyncio.gather(
            _one_server(middleware, events), _one_server(middleware, events), sweepers_here()
        )
        sweeper_counts.append(sweepers)

    sweeper_counts: list[int] = []

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for done in [pool.submit(asyncio.run, two_servers()) for _ in range(2)]:
            done.result(timeout=10)
    assert sorted(events) == ["answered"] * 4 + ["cancelled"] * 4
    assert sweeper_counts == [1, 1]


async def test_a_request_outside_the_layer_is_never_cancelled() -> None:
    """A task of the same server that never entered the gym layers (no exchange in its scope: a route
    answered before them, another app of the server) keeps running after its caller left."""
    protocol = _Protocol()
    middleware = DisconnectCancelMiddleware(_slow_or_fast, watch_delay_s=0.01)
    outside_done = asyncio.Event()

    async def outside(scope: Any, receive: Any, send: Any) -> None:
        await asyncio.sleep(0.15)
        outside_done.set()

    inside = _PolledPeer(dict(SCOPE), protocol)
    inside_task = inside.start(middleware)  # starts the sweeper of this server
    other = _PolledPeer(dict(SCOPE), protocol)
    other_task = other.start(outside)
    await asyncio.sleep(0.03)
    inside.hang_up()
    other.hang_up()
    await asyncio.wait_for(asyncio.gather(inside_task, other_task), 2)
    assert inside.sent == [] and outside_done.is_set() and not other_task.cancelled()
