"""What one rollout's model calls cost: tokens, calls, first-token times, time with a call in flight.

The tally lives here, at the bottom layer, because two layers feed it: the agent's rollout scope
(``gym_obs.server.rollouts``, which makes a tally current and reports it when the rollout ends) and the
client's model-call observation (``gym_obs.client.model_calls``, which adds every model call made inside the
scope on its own, while telemetry is on). A tally is a plain object in a context variable: nothing here
exports telemetry, so it also works with telemetry off, fed by hand (:meth:`RolloutTally.add_usage`, ...).
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator
from typing import Any, Final

__all__ = ["MAX_TTFT_SAMPLES", "RolloutTally", "current_rollout", "tally_context"]

#: Samples of time to first token kept per rollout (a rollout makes tens of calls; this bounds a runaway one).
MAX_TTFT_SAMPLES: Final = 4096

_CURRENT: contextvars.ContextVar[RolloutTally | None] = contextvars.ContextVar("gym_rollout", default=None)


class RolloutTally:
    """What one rollout's model calls cost: tokens, calls, first-token times, time with a call in flight.

    ``model_time_s`` is the time during which at least one model call was in flight (parallel calls are not
    counted twice), so ``duration - model_time_s`` is the time spent elsewhere (tools, verification, the
    agent's own work).
    """

    __slots__ = (
        "_busy_since",
        "_busy_until",
        "_in_flight",
        "input_tokens",
        "model_calls",
        "model_time_s",
        "output_tokens",
        "rollout_id",
        "started",
        "ttfts",
    )

    def __init__(self, rollout_id: str | None) -> None:
        self.rollout_id = rollout_id
        self.started = time.perf_counter()
        self.input_tokens = 0
        self.output_tokens = 0
        self.model_calls = 0
        self.model_time_s = 0.0
        self.ttfts: list[float] = []
        self._in_flight = 0
        self._busy_since = 0.0
        self._busy_until = 0.0

    @contextlib.contextmanager
    def model_call(self) -> Iterator[None]:
        """Time one model call by hand (counted once it starts, whatever its end)."""
        self.call_started()
        try:
            yield
        finally:
            self.call_ended()

    def call_started(self) -> None:
        """One model call started (counted now); pair with exactly one :meth:`call_ended`."""
        self.model_calls += 1
        if self._in_flight == 0:
            self._busy_since = time.perf_counter()
            self._busy_until = self._busy_since
        self._in_flight += 1

    def call_ended(self, at: float | None = None) -> None:
        """One model call ended, at ``at`` (a ``time.perf_counter()`` value; default now).

        ``at`` may lie in the past (the reply's last byte arrived before the caller let go of it); the busy
        period ends at the latest end among its calls, so a late report never shortens it.
        """
        if self._in_flight <= 0:
            return
        end = time.perf_counter() if at is None else at
        if end > self._busy_until:
            self._busy_until = end
        self._in_flight -= 1
        if self._in_flight == 0:
            self.model_time_s += max(0.0, self._busy_until - self._busy_since)

    def add_usage(self, input_tokens: int | None, output_tokens: int | None) -> None:
        """Add one reply's reported usage (invalid counts are ignored)."""
        if type(input_tokens) is int and input_tokens >= 0:
            self.input_tokens += input_tokens
        if type(output_tokens) is int and output_tokens >= 0:
            self.output_tokens += output_tokens

    def add_ttft(self, seconds: float) -> None:
        """Add one streamed call's time to its first content chunk, as the agent saw it."""
        if seconds >= 0 and len(self.ttfts) < MAX_TTFT_SAMPLES:
            self.ttfts.append(seconds)

    def summary(self, duration_s: float | None = None) -> dict[str, Any]:
        """The tallies as JSON-ready numbers (what an agent's reply and the harness rows carry)."""
        duration = time.perf_counter() - self.started if duration_s is None else duration_s
        ordered = sorted(self.ttfts)
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "model_calls": self.model_calls,
            "ttft_p50_s": _quantile(ordered, 0.5),
            "ttft_p99_s": _quantile(ordered, 0.99),
            "model_time_s": round(self.model_time_s, 6),
            "other_time_s": round(max(0.0, duration - self.model_time_s), 6),
        }


def _quantile(ordered: list[float], q: float) -> float | None:
    if not ordered:
        return None
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 6)


def current_rollout() -> RolloutTally | None:
    """The tally of the rollout this code runs in (inside ``rollout_scope``), else None."""
    return _CURRENT.get()


@contextlib.contextmanager
def tally_context(rollout_id: str | None) -> Iterator[RolloutTally]:
    """A fresh tally, current for the block (what ``rollout_scope`` runs its rollout in)."""
    tally = RolloutTally(rollout_id)
    token = _CURRENT.set(tally)
    try:
        yield tally
    finally:
        _CURRENT.reset(token)
