"""The agent side of a rollout: one ``gym.rollout`` span over all of its hops, its outcome counted once.

An agent's rollout route opts in with :func:`rollout_route` (a decorator) or :func:`rollout_scope` (a
``with`` block). Inside, every request the agent makes is a child of the ``gym.rollout`` span and carries
the rollout id; the agent's model calls report what they cost to :func:`current_rollout` (tokens, first-token
time, time in flight: on their own while telemetry is on and the reply is read through ``get_response_json``
or ``iter_sse_data``; by hand otherwise). When the block ends, the span gets the
outcome, the token totals and, for a failure, the root failure kind, and ``gym.rollouts`` /
``gym.rollout.duration`` are recorded by outcome:

- ``completed``: the block returned;
- ``failed``: it raised (the root kind is the deepest gym failure in the explicit cause chain);
- ``omitted``: the system decided not to produce a result -- :class:`RolloutOmitted` (admission refused,
  budget exhausted) or cancellation (the collector went away or cancelled it).

A failure is never turned into a completed rollout: the exception goes on to the caller unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable, Iterator
from contextvars import Token
from typing import Final, ParamSpec, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span

from gym_obs.failures import NgFailureEvent
from gym_obs.telemetry import names
from gym_obs.telemetry._state import STATE
from gym_obs.telemetry.metrics import AttributeCache
from gym_obs.telemetry.propagation import ROLLOUT_ID
from gym_obs.telemetry.spans import (
    INTERNAL_KIND,
    record_exception,
    set_span_error,
    set_trusted_attributes,
    start_trusted_span,
)

# The tally's home is telemetry (the client feeds it); its public names stay importable from here.
from gym_obs.telemetry.tally import RolloutTally as RolloutTally
from gym_obs.telemetry.tally import current_rollout as current_rollout
from gym_obs.telemetry.tally import tally_context

__all__ = ["RolloutOmitted", "rollout_route", "rollout_scope"]

_P = ParamSpec("_P")
_R = TypeVar("_R")

#: A cause chain is followed this deep for the root failure kind.
_MAX_CHAIN: Final = 64

_OUTCOME_ATTRIBUTES: Final = AttributeCache(names.ATTR_ROLLOUT_OUTCOME)


class RolloutOmitted(Exception):
    """Raise inside a rollout when the system decides not to produce a result (admission refused, budget
    exhausted): it is counted ``omitted`` -- neither a failure of the rollout nor a result."""


def root_failure_kind(error: BaseException) -> str | None:
    """The kind of the deepest gym failure in ``error``'s explicit cause chain (bounded, cycle-safe)."""
    kind: str | None = None
    node: BaseException | None = error
    seen: set[int] = set()
    while node is not None and id(node) not in seen and len(seen) < _MAX_CHAIN:
        seen.add(id(node))
        if isinstance(node, NgFailureEvent):
            kind = node.failure_kind
        node = node.__cause__
    return kind


def _outcome_of(error: BaseException | None) -> str:
    if error is None:
        return names.ROLLOUT_OUTCOME_COMPLETED
    if isinstance(error, RolloutOmitted | asyncio.CancelledError):
        return names.ROLLOUT_OUTCOME_OMITTED
    return names.ROLLOUT_OUTCOME_FAILED


def _start_span(rollout_id: str | None) -> tuple[Span | None, Token[Context] | None]:
    """The rollout's span, started and made current (with the token to detach it), or ``(None, None)``."""
    tracer = STATE.tracer
    if not (STATE.enabled and STATE.traces_enabled and STATE.groups.rollout) or tracer is None:
        return None, None
    attributes = {names.ATTR_ROLLOUT_ID: rollout_id} if rollout_id is not None else None
    parent: Context | None = None
    links: list[Link] | None = None
    if STATE.groups.rollout_is_root:  # per_rollout preset: each rollout its own trace, linked to the caller
        caller = trace.get_current_span().get_span_context()
        parent = Context()
        links = [Link(caller)] if caller.is_valid else None
    if links is None:  # the rollout id is validated: no re-cleaning, and no sampler under a sampled parent
        span = start_trusted_span(tracer, names.SPAN_ROLLOUT, parent, INTERNAL_KIND, attributes or {})
    else:
        span = tracer.start_span(
            names.SPAN_ROLLOUT, context=parent, kind=INTERNAL_KIND, links=links, attributes=attributes
        )
    return span, otel_context.attach(trace.set_span_in_context(span))


@contextlib.contextmanager
def rollout_scope(rollout_id: str | None = None) -> Iterator[RolloutTally]:
    """Run the block as one rollout (see the module docstring); ``rollout_id`` defaults to the request's.

    The rollout id and the span are set and reset here directly rather than by two more nested context
    managers (one generator each, per rollout).
    """
    rollout_id = rollout_id if rollout_id is not None else ROLLOUT_ID.get()
    error: BaseException | None = None
    with tally_context(rollout_id) as tally:
        id_token = ROLLOUT_ID.set(rollout_id)
        span, span_token = _start_span(rollout_id)
        try:
            yield tally
        except BaseException as exc:
            error = exc
            raise
        finally:
            _finish(span, tally, error)
            if span is not None and span_token is not None:
                otel_context.detach(span_token)
                span.end()
            ROLLOUT_ID.reset(id_token)


def _finish(span: Span | None, tally: RolloutTally, error: BaseException | None) -> None:
    """Outcome on the span (with the totals and the root kind) and in the metrics; never raises."""
    try:
        duration = time.perf_counter() - tally.started
        outcome = _outcome_of(error)
        if span is not None:
            set_trusted_attributes(  # built here, already valid: one pass without the SDK's re-checks
                span,
                {
                    names.ATTR_ROLLOUT_OUTCOME: outcome,
                    names.ATTR_ROLLOUT_INPUT_TOKENS: tally.input_tokens,
                    names.ATTR_ROLLOUT_OUTPUT_TOKENS: tally.output_tokens,
                    names.ATTR_ROLLOUT_MODEL_CALLS: tally.model_calls,
                },
            )
            if outcome == names.ROLLOUT_OUTCOME_FAILED and isinstance(error, Exception):
                kind = root_failure_kind(error)
                record_exception(span, error)
                set_span_error(span, kind or type(error).__name__)
                if kind is not None:
                    span.set_attribute(names.ATTR_FAILURE_KIND, kind)
        instruments = STATE.instruments
        if STATE.enabled and instruments is not None:
            attributes = _OUTCOME_ATTRIBUTES.get(outcome)
            instruments.rollouts.add(1, attributes)
            instruments.rollout_duration.record(duration, attributes)
    except Exception:  # telemetry never stops the program
        pass


def rollout_route(handler: Callable[_P, Awaitable[_R]]) -> Callable[_P, Awaitable[_R]]:
    """Decorate an agent's async rollout route so each call is one rollout (:func:`rollout_scope`)."""

    @functools.wraps(handler)
    async def route(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with rollout_scope():
            return await handler(*args, **kwargs)

    return route
