"""``gym-obs top``: the in-flight rollouts of every agent the head server knows, live.

Asks the head server for ``/server_instances``, then every agent server (``server_type`` of the agent
boundary) for ``/_gym/inflight``, at once, each with a short timeout; merges the replies into one view
(counts by stage, the oldest rollouts, the stalled ones, retries in progress, hops in flight per server).
An agent that does not answer is shown as such. Everything remote is hostile: only the expected fields are
kept, as the expected types, bounded, and control characters never reach the terminal (``_top_render``).
Works whatever the servers' telemetry setting: the table is plain process memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

import aiohttp

from gym_obs.client import head_server_from_environment, server_base_url
from gym_obs.config import ConfigError, HeadServerConfig, load_global_config
from gym_obs.server._failure_reply import boundary_for_server_type
from gym_obs.server._top_render import render_text
from gym_obs.telemetry import inflight, names

__all__ = ["DEFAULT_TIMEOUT_S", "TopView", "collect", "head_url_for", "run_top"]

DEFAULT_TIMEOUT_S: Final = 2.0
_MAX_AGENTS: Final = 1000
_MAX_REPLY_BYTES: Final = 8 * 1024 * 1024
_MAX_ID_CHARS: Final = 256
_CLEAR: Final = "\x1b[H\x1b[2J"
_STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM)
_CANCEL_WAIT_S: Final = 1.0  # a refresh cancelled by Ctrl-C gets this long to let go of its connections


@dataclass
class AgentStatus:
    name: str
    url: str
    answered: bool
    error: str | None = None
    in_flight: int = 0
    evicted: int = 0
    stalled: int = 0
    retrying: int = 0

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class TopView:
    """One refresh: what every agent said, merged."""

    head: str
    stall_after_s: float
    at: float = field(default_factory=time.time)
    head_error: str | None = None
    agents: list[AgentStatus] = field(default_factory=list)
    by_stage: dict[str, int] = field(default_factory=dict)
    hops_by_server: dict[str, int] = field(default_factory=dict)
    oldest: list[dict[str, Any]] = field(default_factory=list)
    stalled: list[dict[str, Any]] = field(default_factory=list)
    retrying: list[dict[str, Any]] = field(default_factory=list)

    @property
    def in_flight(self) -> int:
        return sum(agent.in_flight for agent in self.agents)

    def as_json(self) -> dict[str, Any]:
        return {
            "head": self.head,
            "at": self.at,
            "head_error": self.head_error,
            "stall_after_s": self.stall_after_s,
            "in_flight": self.in_flight,
            "stalled_count": sum(agent.stalled for agent in self.agents),
            "retrying_count": sum(agent.retrying for agent in self.agents),
            "evicted": sum(agent.evicted for agent in self.agents),
            "agents": [agent.as_json() for agent in self.agents],
            "by_stage": self.by_stage,
            "hops_by_server": self.hops_by_server,
            "oldest": self.oldest,
            "stalled": self.stalled,
            "retrying": self.retrying,
        }


def head_url_for(config: Path | None, head: str | None) -> str:
    """``--head URL`` as given, else the head server of ``CONFIG``, else ``GYM_OBS_HEAD_SERVER``, else the
    default 127.0.0.1:11000."""
    if head:
        return head.rstrip("/")
    if config is not None:
        head_config = load_global_config(config).head_server
    else:
        head_config = head_server_from_environment() or HeadServerConfig()
    return server_base_url(head_config.host, head_config.port)


# --- reading remote replies (hostile until shaped) ------------------------------------------------------


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _num(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return 0.0
    return float(value)


def _text(value: object, limit: int = _MAX_ID_CHARS) -> str:
    return value[:limit] if isinstance(value, str) else ""


def _counts(value: object) -> dict[str, int]:
    if not isinstance(value, Mapping):
        return {}
    return {_text(k, 64): _int(v) for k, v in list(value.items())[:64]}


def _rollout(agent: str, value: object) -> dict[str, Any] | None:
    if not isinstance(value, Mapping):
        return None
    hops = value.get("hops")
    return {
        "agent": agent,
        "rollout_id": _text(value.get("rollout_id")),
        "stage": _text(value.get("stage"), 64),
        "elapsed_s": _num(value.get("elapsed_s")),
        "since_progress_s": _num(value.get("since_progress_s")),
        "hops_in_flight": _int(value.get("hops_in_flight")),
        "hops": [
            {"server": _text(h.get("server"), 64), "attempt": _int(h.get("attempt"))}
            for h in (hops if isinstance(hops, list) else [])[:8]
            if isinstance(h, Mapping)
        ],
        "retries": _int(value.get("retries")),
        "retrying": value.get("retrying") is True,
        "stalled": value.get("stalled") is True,
    }


def _rollouts(agent: str, value: object, limit: int) -> list[dict[str, Any]]:
    rows = [_rollout(agent, item) for item in (value if isinstance(value, list) else [])[:limit]]
    return [row for row in rows if row is not None]


def _merge(view: TopView, status: AgentStatus, reply: Mapping[str, Any], limit: int) -> None:
    status.in_flight = _int(reply.get("in_flight"))
    status.evicted = _int(reply.get("evicted"))
    status.stalled = _int(reply.get("stalled_count"))
    status.retrying = _int(reply.get("retrying_count"))
    for target, key in ((view.by_stage, "by_stage"), (view.hops_by_server, "hops_by_server")):
        for name, count in _counts(reply.get(key)).items():
            target[name] = target.get(name, 0) + count
    view.oldest += _rollouts(status.name, reply.get("oldest"), limit)
    view.stalled += _rollouts(status.name, reply.get("stalled"), limit)
    view.retrying += _rollouts(status.name, reply.get("retrying"), limit)


# --- collecting ------------------------------------------------------------------------------------------


async def _get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url, allow_redirects=False) as response:
        if response.status != 200:
            raise ValueError(f"HTTP {response.status}")
        body = await response.content.read(_MAX_REPLY_BYTES + 1)
        if len(body) > _MAX_REPLY_BYTES:
            raise ValueError("reply too large")
        return json.loads(body)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer (timeout)"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "no answer (connection refused or unreachable)"
    if isinstance(exc, aiohttp.ClientError):
        return f"no answer ({type(exc).__name__})"
    return f"bad reply ({str(exc)[:80] or type(exc).__name__})"


async def _agent(
    session: aiohttp.ClientSession, name: str, url: str, query: str
) -> tuple[AgentStatus, Mapping[str, Any] | None]:
    try:
        reply = await _get_json(session, url + names.INFLIGHT_ROUTE + query)
        if not isinstance(reply, Mapping):
            raise ValueError("not a JSON object")
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        return AgentStatus(name, url, answered=False, error=_reason(exc)), None
    return AgentStatus(name, url, answered=True), reply


async def collect(
    head: str,
    *,
    limit: int = inflight.DEFAULT_LIMIT,
    stall_after_s: float = inflight.DEFAULT_STALL_AFTER_S,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> TopView:
    """One refresh of the view; never raises for a server that does not answer (it is in the view)."""
    view = TopView(head=head, stall_after_s=stall_after_s)
    limit = max(0, min(limit, inflight.MAX_LIMIT))
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        try:
            instances = await _get_json(session, head + "/server_instances")
            if not isinstance(instances, list):
                raise ValueError("not a JSON list")
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            view.head_error = _reason(exc)
            return view
        agents = [
            (_text(item.get("name"), 128), _text(item.get("url"), 512))
            for item in instances[:_MAX_AGENTS]
            if isinstance(item, Mapping)
            and isinstance(item.get("server_type"), str)
            and boundary_for_server_type(item["server_type"]) == "agent"
            and _text(item.get("url"), 512).startswith(("http://", "https://"))
        ]
        query = f"?limit={limit}&stall_after={stall_after_s:g}"
        results = await asyncio.gather(*(_agent(session, name, url, query) for name, url in agents))
    for status, reply in results:
        view.agents.append(status)
        if reply is not None:
            _merge(view, status, reply, limit)
    for key in ("oldest", "stalled", "retrying"):
        rows: list[dict[str, Any]] = getattr(view, key)
        rows.sort(key=lambda row: -row["elapsed_s"])
        del rows[limit:]
    return view


# --- the command ------------------------------------------------------------------------------------------


def run_top(
    config: Path | None,
    head: str | None,
    *,
    once: bool = False,
    as_json: bool = False,
    limit: int = 10,
    stall_after_s: float = inflight.DEFAULT_STALL_AFTER_S,
    interval_s: float = 1.0,
    out: IO[str] | None = None,
) -> int:
    """Print the view once (``once``; JSON with ``as_json``) or refresh it every ``interval_s`` until
    Ctrl-C. Exit status: 0; 1 when ``once`` and the head server did not answer; 2 for a bad CONFIG."""
    stream = out if out is not None else sys.stdout
    try:
        url = head_url_for(config, head)
    except (ConfigError, OSError) as exc:
        print(f"gym-obs top: error: {exc}", file=sys.stderr)
        return 2

    def frame(view: TopView) -> str:
        if as_json:
            return json.dumps(view.as_json(), indent=None if not once else 2)
        return render_text(view.as_json())

    async def refresh() -> TopView:
        return await collect(url, limit=limit, stall_after_s=stall_after_s)

    if once:
        view = asyncio.run(refresh())
        print(frame(view), file=stream, flush=True)
        return 1 if view.head_error is not None else 0

    clear = _CLEAR if not as_json and stream.isatty() else ""

    async def show() -> None:
        view = await refresh()
        print(clear + frame(view), file=stream, flush=True)

    with contextlib.suppress(KeyboardInterrupt):  # (where the signals cannot be handled by the loop)
        asyncio.run(_until_stopped(show, interval_s))
    return 0


async def _until_stopped(show: Callable[[], Awaitable[None]], interval_s: float) -> None:
    """``show()`` every ``interval_s`` until Ctrl-C (SIGINT) or SIGTERM.

    The signals set an event this loop waits on, next to the refresh in flight (then cancelled, with a
    bounded wait): a cancellation alone can be lost inside a library that turns it into an error of its
    own, and the view would go on refreshing after Ctrl-C.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    handled: list[signal.Signals] = []
    for signum in _STOP_SIGNALS:
        try:
            loop.add_signal_handler(signum, stop.set)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no such support
            continue
        handled.append(signum)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        while not stop.is_set():
            started = time.monotonic()
            refreshing = asyncio.ensure_future(show())
            await asyncio.wait((refreshing, stopped), return_when=asyncio.FIRST_COMPLETED)
            if not refreshing.done():
                refreshing.cancel()
                await asyncio.wait((refreshing,), timeout=_CANCEL_WAIT_S)
                break
            refreshing.result()  # (its own errors propagate)
            await asyncio.wait((stopped,), timeout=max(0.0, interval_s - (time.monotonic() - started)))
    finally:
        stopped.cancel()
        for signum in handled:
            loop.remove_signal_handler(signum)
