"""The driver: many concurrent rollouts through the agents, one traced span and one row per rollout.

The driver is a gym process like the servers (service ``gym/harness``): each rollout is an INTERNAL span
``gym.harness.rollout`` whose trace continues through the agent (its ``gym.rollout`` span, which counts
the rollout's outcome) into the model and resources servers; the rollout id travels with every hop, and a
failure comes back as the remote root cause (``raise_boundary_failure``), never as a bare HTTP 500.
Failures the driver observes itself (the agent unreachable, a timeout, a reply that is not the agent
protocol) are ``NgFailureEvent``s at boundary ``harness`` raised from the error they saw: one bad reply
fails one rollout, never the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
from opentelemetry import context as otel_context
from opentelemetry.trace import Span, Tracer, set_span_in_context

from gym_obs.client import ServerClient
from gym_obs.client.http_client import raise_boundary_failure
from gym_obs.failures import NgFailureEvent, observe_failure, request_failure_log
from gym_obs.harness.agent_reply import AgentReply, malformed_reply, parse_agent_reply, recovered_failures
from gym_obs.harness.rows import RolloutResult
from gym_obs.harness.servers._common import failure_for_call
from gym_obs.harness.tally import RunTally
from gym_obs.telemetry import names
from gym_obs.telemetry.propagation import rollout_context
from gym_obs.telemetry.spans import (
    INTERNAL_KIND,
    current_ids,
    record_exception,
    set_span_error,
    start_trusted_span,
)

__all__ = ["Driver"]

_RUN_ROUTE = "/run"
_DRIVER_MAX_TRIES = 3


@dataclass
class Driver:
    """Runs ``rollouts`` rollouts with at most ``concurrency`` in flight, round-robin over ``agents``."""

    client: ServerClient
    agents: list[str]
    run_id: str
    rollout_timeout_s: float
    tracer: Tracer | None = None
    cancelled: int = 0  # rollouts in flight when the run was stopped

    @contextlib.contextmanager
    def _span(self, rollout_id: str) -> Iterator[Span | None]:
        if self.tracer is None:
            yield None
            return
        # the run's own id: valid and bounded, so the span starts without the SDK's attribute cleaning
        attributes = {names.ATTR_ROLLOUT_ID: rollout_id}
        name = names.SPAN_HARNESS_ROLLOUT
        span = start_trusted_span(self.tracer, name, None, INTERNAL_KIND, attributes)
        token = otel_context.attach(set_span_in_context(span))
        try:
            yield span  # an exception is recorded by the caller, as a failed row says it
        finally:
            otel_context.detach(token)
            span.end()

    async def rollout(self, index: int) -> RolloutResult:
        """One rollout: ``POST /run`` on an agent inside the rollout's context and span."""
        rollout_id = f"{self.run_id}-{index:06d}"
        agent = self.agents[index % len(self.agents)]
        started_at = time.time()
        started = time.perf_counter()
        # The rollout's own failure log: the agent's failure reply is merged into it (raise_boundary_failure),
        # so a failed row keeps the failures the agent recovered from, not only the final chain.
        with rollout_context(rollout_id), self._span(rollout_id) as span, request_failure_log() as log:
            trace_id = current_ids()[0]
            common: dict[str, Any] = {
                "index": index,
                "rollout_id": rollout_id,
                "agent": agent,
                "started_at": started_at,
                "trace_id": trace_id,
            }
            try:
                reply = await self._run(agent, index)
            except Exception as err:
                failure = err if isinstance(err, NgFailureEvent) else self._own_failure(err, agent)
                # counts failures first seen here (forwarded ones were counted); one walk of the chain
                report = log.report_around(observe_failure(failure))
                if span is not None:
                    record_exception(span, failure)
                    set_span_error(span, failure.failure_kind)
                result = RolloutResult.failed(
                    failure, report=report, duration_s=time.perf_counter() - started, **common
                )
            else:
                result = RolloutResult(
                    outcome=names.ROLLOUT_OUTCOME_COMPLETED,
                    duration_s=time.perf_counter() - started,
                    reward=reply.reward,
                    hops=reply.hops,
                    report=reply.recovered,
                    usage=reply.usage,
                    **common,
                )
            if span is not None:
                span.set_attribute(names.ATTR_ROLLOUT_OUTCOME, result.outcome)
        # gym.rollouts / gym.rollout.duration are the agent's (its gym.rollout span, server.rollouts):
        # counting here too would count every rollout twice in a fleet's dashboards.
        return result

    async def _run(self, agent: str, index: int) -> AgentReply:
        response = await self.client.post(
            agent,
            _RUN_ROUTE,
            json={"prompt": f"task {index}", "task_index": index},
            timeout=aiohttp.ClientTimeout(total=self.rollout_timeout_s),
            _route=_RUN_ROUTE,
            _max_num_tries=_DRIVER_MAX_TRIES,
            _retry_other_errors=False,  # a timed-out rollout is a result, not something to run again
            _read_body=True,
        )
        try:
            await raise_boundary_failure(response)
            recovered = recovered_failures(response.headers)
            try:
                body = await response.json(content_type=None)
            except ValueError as err:  # not JSON, or not UTF-8
                raise malformed_reply(agent, f"is not JSON ({type(err).__name__})") from err
        finally:
            response.release()
        return parse_agent_reply(body, agent, recovered)

    @staticmethod
    def _own_failure(err: Exception, agent: str) -> NgFailureEvent:
        failure = failure_for_call(
            err, role="agent", stage="agent", what=f"rollout on {agent}", boundary="harness"
        )
        failure.__cause__ = err
        return failure

    async def run(
        self,
        rollouts: int,
        concurrency: int,
        on_result: Callable[[RolloutResult], None],
        stop: asyncio.Event | None = None,
    ) -> RunTally:
        """Run every rollout; ``on_result`` sees each result as it finishes (rows, progress bar) before the
        worker awaits its next rollout. Results are folded into a :class:`RunTally`, never kept.

        When ``stop`` is set (Ctrl-C), no new rollout starts and the ones in flight are cancelled: their
        count is ``self.cancelled``; every finished rollout keeps its row and its place in the tally.
        """
        tally = RunTally()
        counter = itertools.count()
        in_flight = 0

        async def worker() -> None:
            nonlocal in_flight
            while (index := next(counter)) < rollouts and not (stop is not None and stop.is_set()):
                in_flight += 1
                try:
                    result = await self.rollout(index)
                finally:
                    in_flight -= 1
                on_result(result)
                tally.add(result)

        workers = asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, rollouts)))))
        if stop is None:
            await workers
            return tally
        stopped: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
        pending: set[asyncio.Future[Any]] = {workers, stopped}
        try:
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if workers.done():
            workers.result()  # a worker's own error (a row that could not be written) ends the run
            return tally
        self.cancelled = in_flight
        workers.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await workers
        return tally
