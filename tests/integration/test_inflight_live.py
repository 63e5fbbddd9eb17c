"""The live view of in-flight rollouts, on launched processes with telemetry off.

A demo stack (head, agent, model, resources) is launched with a model that hangs on every call; rollouts
sent to the agent stay in flight. ``gym-obs top --once --json`` (a real subprocess) must show them stalled
within ``--stall-after`` plus a refresh, name the hop in progress, show an agent that does not answer as
such, and keep the agent's ``/_gym/inflight`` reply bounded with 10,000 rollouts in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gym_obs.config import GlobalConfig
from gym_obs.harness.faults import parse_fault_plan
from gym_obs.harness.stack import HarnessOptions, build_layout
from gym_obs.server.launcher import Launch, launch
from gym_obs.telemetry import names

pytestmark = pytest.mark.integration

PORT_BASE = 16400  # head 16400, agent_0 16401, model_0 16402, resources_0 16403
HEAD = f"http://127.0.0.1:{PORT_BASE}"
AGENT = f"http://127.0.0.1:{PORT_BASE + 1}"
STALL_AFTER_S = 1.5
#: A refresh of ``top`` is one request per agent: within a second of the stall threshold on an idle
#: machine; the rest is slack for a loaded one.
STALL_DEADLINE_S = STALL_AFTER_S + 8.0


class _Rollouts:
    """``count`` rollouts posted to the agent from a thread of their own; they hang until stopped."""

    def __init__(self, count: int, prefix: str, batch: int = 500) -> None:
        self.count = count
        self.prefix = prefix
        self.batch = batch
        self.sent = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._run(),))
        self._stop: asyncio.Event | None = None

    async def _one(self, session: aiohttp.ClientSession, index: int) -> None:
        headers = {names.ROLLOUT_ID_HEADER: f"{self.prefix}-{index}"}
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with session.post(AGENT + "/run", json={"prompt": "p"}, headers=headers) as reply:
                await reply.read()

    async def _in_flight(self, session: aiohttp.ClientSession) -> int:
        async with session.get(AGENT + names.INFLIGHT_ROUTE + "?limit=0") as reply:
            count: int = (await reply.json())["in_flight"]
            return count

    async def _run(self) -> None:
        self._stop = asyncio.Event()
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout()) as session:
            tasks: list[asyncio.Task[None]] = []
            # In batches: ten thousand connects at once overflow the listen backlog and the agent's
            # request-head timeout on a loaded machine; the agent's table is what is under test.
            while len(tasks) < self.count:
                first = len(tasks)
                tasks += [
                    asyncio.create_task(self._one(session, i))
                    for i in range(first, min(first + self.batch, self.count))
                ]
                while True:
                    if await self._in_flight(session) >= len(tasks):
                        break
                    await asyncio.sleep(0.1)
            self._loop.call_soon(self.sent.set)
            await self._stop.wait()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def __enter__(self) -> _Rollouts:
        self._thread.start()
        assert self.sent.wait(240)
        return self

    def __exit__(self, *_exc: object) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)
        self._loop.close()


@contextlib.contextmanager
def _hanging_stack(tmp_path: Path, *, max_inflight: int | None = None) -> Iterator[Launch]:
    plan = parse_fault_plan({"faults": [{"server": "model", "route": "/v1/responses", "action": "hang"}]})
    options = HarnessOptions(
        telemetry=False,
        fault_plan=plan,
        port_base=PORT_BASE,
        request_timeout_s=300.0,  # the agent waits on the hung model for the whole test
        turns=1,
        fanout=1,
        out=tmp_path / "out",
    )
    config: GlobalConfig | dict[str, Any] = build_layout(options).config
    if max_inflight is not None:  # launch() takes the config as a dict too
        assert isinstance(config, GlobalConfig)
        config = config.model_dump(mode="json", exclude_none=True)
        config["servers"]["agent_0"]["max_inflight_rollouts"] = max_inflight
    env = {names.ENV_TELEMETRY: "0"}
    with launch(config, log_dir=tmp_path / "logs", env=env) as running:
        yield running


def _top(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYM_OBS_"))}
    return subprocess.run(
        [sys.executable, "-m", "gym_obs.cli", "top", "--head", HEAD, "--once", *args],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip


def _top_json(*args: str) -> dict[str, Any]:
    done = _top("--json", *args)
    assert done.returncode == 0, done.stderr[-2000:]
    view: dict[str, Any] = json.loads(done.stdout)
    return view


def _agent_pid(running: Launch) -> int:
    return next(proc.pid for proc in running.processes() if proc.name == "agent_0")


def test_a_hung_model_shows_its_rollouts_stalled(tmp_path: Path) -> None:
    with _hanging_stack(tmp_path) as running, _Rollouts(6, "hang"):
        started = time.monotonic()
        ids = {f"hang-{i}" for i in range(6)}
        while True:
            view = _top_json("--stall-after", str(STALL_AFTER_S))
            stalled = {row["rollout_id"] for row in view["stalled"]}
            if stalled == ids:
                break
            assert time.monotonic() - started < STALL_DEADLINE_S, view
            time.sleep(0.2)
        assert view["head_error"] is None
        assert [(a["name"], a["answered"], a["in_flight"]) for a in view["agents"]] == [("agent_0", True, 6)]
        assert view["in_flight"] == 6 and view["stalled_count"] == 6 and view["retrying_count"] == 0
        assert view["by_stage"] == {"agent": 6}  # past admission, waiting on the model turn
        assert view["hops_by_server"] == {"model_0": 6}  # named by the config, not by address
        for row in view["stalled"]:
            assert row["hops"] == [{"server": "model_0", "attempt": 1}]
            assert row["since_progress_s"] >= STALL_AFTER_S and row["elapsed_s"] >= row["since_progress_s"]
        # oldest first across agents: elapsed never increases down the list
        elapsed = [row["elapsed_s"] for row in view["oldest"]]
        assert elapsed == sorted(elapsed, reverse=True) and len(elapsed) == 6

        text = _top("--stall-after", str(STALL_AFTER_S))
        assert text.returncode == 0, text.stderr[-2000:]
        assert "in flight 6   stalled 6" in text.stdout and "hang-0" in text.stdout
        assert "STALLED" in text.stdout and "model_0#1" in text.stdout

        # An agent that does not answer (stopped) is shown as such, and top still exits 0.
        pid = _agent_pid(running)
        os.kill(pid, signal.SIGSTOP)
        try:
            view = _top_json()
        finally:
            os.kill(pid, signal.SIGCONT)
        assert [(a["name"], a["answered"]) for a in view["agents"]] == [("agent_0", False)]
        assert view["agents"][0]["error"] == "no answer (timeout)"
        assert view["in_flight"] == 0


@pytest.mark.timeout(420)
def test_ten_thousand_rollouts_keep_the_reply_bounded(tmp_path: Path) -> None:
    count = 10_000
    with _hanging_stack(tmp_path, max_inflight=16) as _running, _Rollouts(count, "bulk"):
        started = time.monotonic()
        while True:
            with contextlib.suppress(OSError):
                view = _top_json("--limit", "200")
                if view["in_flight"] == count:
                    break
            assert time.monotonic() - started < 240, view["in_flight"]
            time.sleep(1.0)
        assert view["by_stage"] == {"admission": count - 16, "agent": 16}
        # The route itself: a capped limit, so the reply stays small whatever the table holds.
        import urllib.request

        with urllib.request.urlopen(AGENT + names.INFLIGHT_ROUTE + "?limit=100000", timeout=30) as reply:
            body = reply.read()
        route = json.loads(body)
        assert route["in_flight"] == count and route["limit"] == 200 and len(route["oldest"]) == 200
        assert route["evicted"] == 0
        assert len(body) < 512 * 1024, len(body)
        assert route["oldest"][0]["elapsed_s"] >= route["oldest"][-1]["elapsed_s"]


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_top_refreshes_until_ctrl_c_and_exits_cleanly(tmp_path: Path, stop_signal: signal.Signals) -> None:
    """Live mode with no head server listening: every frame says so, and SIGINT (or SIGTERM) ends it with
    status 0."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYM_OBS_"))}
    out_path, err_path = tmp_path / "out.txt", tmp_path / "err.txt"
    head = "gym-obs top   head http://127.0.0.1:16799"
    with out_path.open("w") as out_file, err_path.open("w") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gym_obs.cli", "top", "--head", "http://127.0.0.1:16799",
             "--interval", "0.2"],
            stdout=out_file, stderr=err_file, text=True, env=env,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while out_path.read_text().count(head) < 3:  # started (imports are slow on a loaded machine)
                assert proc.poll() is None and time.monotonic() < deadline, err_path.read_text()[-2000:]
                time.sleep(0.1)
            proc.send_signal(stop_signal)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    out, err = out_path.read_text(), err_path.read_text()
    assert proc.returncode == 0, err[-2000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]
    frames = out.count(head)
    assert out.count("head server: no answer (connection refused or unreachable)") == frames >= 3
