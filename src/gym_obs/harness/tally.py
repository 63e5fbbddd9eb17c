"""What the summary needs from every rollout, folded in as results arrive: memory stays flat as runs grow.

The driver used to keep every result for the summary (~1.5 KB per rollout). A :class:`RunTally` keeps
exact counts (outcomes, failures by root cause) and a fixed-size :class:`QuantileSketch` per latency, so a
run of any length costs the same few hundred kilobytes. Keys that come from remote input (hop roles, foreign
exception types) are capped: past the cap they are counted under ``(other)``, never dropped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any, Final

from gym_obs.harness.rows import RolloutResult
from gym_obs.harness.stats import QuantileSketch
from gym_obs.telemetry import names

__all__ = ["MAX_FAILURE_GROUPS", "MAX_HOP_ROLES", "OTHER", "RunTally"]

MAX_FAILURE_GROUPS: Final = 256
MAX_HOP_ROLES: Final = 32
OTHER: Final = "(other)"
_NO_GROUP: Final = "-"

_GroupKey = tuple[str, str, str, str]
_USAGE_SUMS: Final = ("input_tokens", "output_tokens", "model_calls", "model_time_s", "other_time_s")


class RunTally:
    """Streaming statistics of a run: ``add`` each result once, then read the summary's parts."""

    def __init__(self, agent_role: str = "agent") -> None:
        self.agent_role = agent_role
        self.rollouts = 0
        self.outcomes: Counter[str] = Counter()
        self.latency = QuantileSketch()
        self.recovered_failures = 0
        self._groups: Counter[_GroupKey] = Counter()
        self._examples: dict[_GroupKey, str | None] = {}
        self._hops: dict[str, QuantileSketch] = {}
        self._usage_totals: dict[str, float] = dict.fromkeys(_USAGE_SUMS, 0.0)
        self._usage_rollouts = 0
        self._ttft_p50 = QuantileSketch()
        self._ttft_p99 = QuantileSketch()

    @classmethod
    def of(cls, results: Iterable[RolloutResult]) -> RunTally:
        tally = cls()
        for result in results:
            tally.add(result)
        return tally

    def add(self, result: RolloutResult) -> None:
        self.rollouts += 1
        self.outcomes[result.outcome] += 1
        self.latency.add(result.duration_s)
        self.recovered_failures += result.recovered_failures
        if result.root is not None:
            self._add_group(result)
        for role, seconds in result.hops:
            self._hop(role).add(seconds)
        if result.usage is not None:
            self._add_usage(result.usage)

    def _add_usage(self, usage: dict[str, float | int | None]) -> None:
        self._usage_rollouts += 1
        for key in _USAGE_SUMS:
            value = usage.get(key)
            if value is not None:
                self._usage_totals[key] += value
        for key, sketch in (("ttft_p50_s", self._ttft_p50), ("ttft_p99_s", self._ttft_p99)):
            value = usage.get(key)
            if value is not None:
                sketch.add(float(value))

    def model_calls(self) -> dict[str, Any] | None:
        """Model-call totals over the rollouts whose agent reported them (None when none did): tokens,
        calls, time with a model call in flight vs elsewhere, and the per-rollout TTFT p50/p99 spread."""
        if not self._usage_rollouts:
            return None
        totals = self._usage_totals
        model_s, other_s = totals["model_time_s"], totals["other_time_s"]
        return {
            "rollouts_reporting": self._usage_rollouts,
            "input_tokens": int(totals["input_tokens"]),
            "output_tokens": int(totals["output_tokens"]),
            "model_calls": int(totals["model_calls"]),
            "model_time_s": round(model_s, 6),
            "other_time_s": round(other_s, 6),
            "model_time_share": round(model_s / (model_s + other_s), 4) if model_s + other_s > 0 else None,
            "ttft_p50_s": self._ttft_p50.summary(),
            "ttft_p99_s": self._ttft_p99.summary(),
        }

    def _add_group(self, result: RolloutResult) -> None:
        root = result.root
        assert root is not None
        key: _GroupKey = (
            root.kind or _NO_GROUP,
            root.boundary or _NO_GROUP,
            root.foreign_type or _NO_GROUP,
            root.final_kind or _NO_GROUP,
        )
        if key not in self._groups and len(self._groups) >= MAX_FAILURE_GROUPS:
            key = (OTHER, OTHER, OTHER, OTHER)
        self._groups[key] += 1
        self._examples.setdefault(key, result.trace_id)

    def _hop(self, role: str) -> QuantileSketch:
        hop = f"{self.agent_role} -> {role}"
        sketch = self._hops.get(hop)
        if sketch is None:
            if len(self._hops) >= MAX_HOP_ROLES:
                hop = f"{self.agent_role} -> {OTHER}"
                sketch = self._hops.get(hop)
            if sketch is None:
                sketch = self._hops[hop] = QuantileSketch()
        return sketch

    def failure_groups(self) -> list[dict[str, Any]]:
        return [
            {
                "root_kind": key[0],
                "root_boundary": key[1],
                "foreign_cause": key[2],
                "final_kind": key[3],
                "count": count,
                "example_trace_id": self._examples[key],
            }
            for key, count in self._groups.most_common()
        ]

    def hops(self) -> dict[str, dict[str, Any]]:
        """Latency per hop as the callers measured it: the driver's ``/run``, then the agent's calls."""
        hops = {f"harness -> {self.agent_role}": self.latency.summary()}
        hops.update((hop, sketch.summary()) for hop, sketch in self._hops.items())
        return hops

    def outcome_counts(self) -> dict[str, int]:
        return {outcome: self.outcomes.get(outcome, 0) for outcome in names.ROLLOUT_OUTCOMES}
