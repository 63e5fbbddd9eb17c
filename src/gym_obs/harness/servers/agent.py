"""Demo agent server: ``POST /run`` runs one rollout -- model turns with parallel fan-out, then a verify.

The shape of a real agent loop: sequential turns (each waits for the model), every ``fanout_every``-th turn
fans out ``fanout`` parallel model calls (tool calls, sampling), then one ``/verify`` on a resources server
inside the rollout's session. Calls go through ``ServerClient``, so every hop is a CLIENT span, retried
attempts are recorded as recovered failure events, and a failed call becomes an ``NgFailureEvent`` raised
``from`` the error it saw.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import zlib
from typing import Any, ClassVar

import aiohttp
import orjson
from fastapi import FastAPI, Request
from pydantic import Field

from gym_obs import TimedSemaphore, rollout_scope
from gym_obs.client.http_client import (
    get_response_json,
    iter_sse_data,
    observe_transport_failures,
    raise_boundary_failure,
)
from gym_obs.failures.kinds import Boundary, Stage
from gym_obs.harness.fault_middleware import raise_injected_fault
from gym_obs.harness.servers._common import HarnessServer, OwnConfig, failure_for_call
from gym_obs.telemetry import inflight, names
from gym_obs.telemetry.propagation import current_rollout_id

__all__ = ["AgentServer", "AgentSettings"]

RUN_ROUTE = "/run"
_MODEL_ROUTE = "/v1/responses"
_VERIFY_ROUTE = "/verify"


class AgentSettings(OwnConfig):
    models: list[str] = Field(min_length=1)
    resources: list[str] = Field(min_length=1)
    turns: int = Field(default=3, ge=1, le=100)
    fanout: int = Field(default=3, ge=1, le=64)
    fanout_every: int = Field(default=2, ge=1, description="every Nth turn fans out (turn 2, 4, ...)")
    request_timeout_s: float = Field(default=10.0, gt=0)
    max_tries: int = Field(default=4, ge=1, le=20)
    max_inflight_rollouts: int = Field(default=64, ge=1, le=100_000)
    #: Ask for streamed (SSE) model replies and read them event by event (the harness's ``--stream``).
    stream: bool = False


class AgentServer(HarnessServer):
    """Runs rollouts against the configured model and resources servers."""

    role: ClassVar = "agent"
    sessions_enabled: ClassVar = False  # stateless: no session token per request
    settings_model: ClassVar = AgentSettings
    hooked_routes: ClassVar = frozenset({RUN_ROUTE})

    def setup_webserver(self) -> FastAPI:
        settings = self.settings
        assert isinstance(settings, AgentSettings)
        self._model_cycle = itertools.cycle(settings.models)
        admission = TimedSemaphore(settings.max_inflight_rollouts, site=names.CONCURRENCY_SITE_AGENT_ROLLOUTS)
        app = self.new_app()

        @app.post(RUN_ROUTE)
        async def run(request: Request) -> dict[str, Any]:
            body = await request.json()
            inflight.set_stage("admission")  # the live view (gym-obs top): waiting for a rollout slot
            async with admission:  # queueing before HTTP shows as gym.concurrency.wait.duration
                inflight.set_stage("agent")
                with rollout_scope() as tally:  # the gym.rollout span: parent of every hop below
                    reply = await self.run_rollout(body if isinstance(body, dict) else {})
                    if tally.model_calls:  # fed by the model-call telemetry: none with telemetry off
                        reply["usage"] = tally.summary()
                    return reply

        return app

    async def _call(
        self,
        role: str,
        server: str,
        route: str,
        payload: dict[str, Any],
        stage: Stage,
        hops: list[Any],
    ) -> dict[str, Any]:
        settings = self.settings
        assert isinstance(settings, AgentSettings)
        boundary: Boundary = "model" if role == "model" else "resources_server"
        stream = role == "model" and settings.stream
        started = time.perf_counter()
        try:
            response = await self.server_client.post(
                server,
                route,
                json={**payload, "stream": True} if stream else payload,
                timeout=aiohttp.ClientTimeout(total=settings.request_timeout_s),
                _route=route,
                _max_num_tries=settings.max_tries,
                _read_body=not stream,
                _on_transport_failure=observe_transport_failures(boundary, stage),
            )
            try:
                await raise_boundary_failure(response)
                # Read through gym_obs's helpers: a model call's tokens, first-token time and time in flight
                # go to its CLIENT span, the GenAI metrics and this rollout's tally on their own.
                result = await _final_response(response) if stream else await get_response_json(response)
            finally:
                response.release()
        except Exception as err:
            raise failure_for_call(
                err, role=role, stage=stage, what=f"{role} call to {server}{route}"
            ) from err
        hops.append((role, time.perf_counter() - started))
        return result if isinstance(result, dict) else {}

    async def _generate(self, turn: int, history: list[str], hops: list[Any]) -> str:
        payload = {"input": history[-4:], "metadata": {"turn": turn}}
        reply = await self._call("model", next(self._model_cycle), _MODEL_ROUTE, payload, "agent", hops)
        try:
            return str(reply["output"][0]["content"][0]["text"])
        except (KeyError, IndexError, TypeError):
            return ""

    async def run_rollout(self, task: dict[str, Any]) -> dict[str, Any]:
        """Turns, fan-out, then verification; returns the reward and the time spent per hop."""
        settings = self.settings
        assert isinstance(settings, AgentSettings)
        raise_injected_fault()  # where a real agent loop's bug would surface
        rollout_id = current_rollout_id() or str(task.get("rollout_id", "anonymous"))
        hops: list[tuple[str, float]] = []
        history = [str(task.get("prompt", "solve the task"))]
        model_calls = 0
        for turn in range(settings.turns):
            if settings.fanout > 1 and (turn + 1) % settings.fanout_every == 0:
                texts = await asyncio.gather(
                    *(self._generate(turn, history, hops) for _ in range(settings.fanout))
                )
                model_calls += len(texts)
                history.append(texts[0])
            else:
                history.append(await self._generate(turn, history, hops))
                model_calls += 1
        resources = settings.resources[zlib.crc32(rollout_id.encode()) % len(settings.resources)]
        inflight.set_stage("verification")
        verdict = await self._call(
            "resources",
            resources,
            _VERIFY_ROUTE,
            {"response": history[-1], "expected": f"answer {settings.turns - 1}", "session_id": rollout_id},
            "verification",
            hops,
        )
        return {
            "rollout_id": rollout_id,
            "reward": verdict.get("reward"),
            "turns": settings.turns,
            "model_calls": model_calls,
            "hops": hops,
        }


async def _final_response(response: aiohttp.ClientResponse) -> dict[str, Any]:
    """A streamed Responses reply read event by event: its final response object (with its usage)."""
    final: dict[str, Any] = {}
    async for data in iter_sse_data(response):
        if b'"response.completed"' not in data and b'"response.incomplete"' not in data:
            continue  # deltas: the text arrives again in the final event
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        done = event.get("response") if isinstance(event, dict) else None
        final = done if isinstance(done, dict) else {}
    return final
