"""The agent's ``/run`` reply as the driver accepts it: validated, bounded, or one rollout's clear failure.

An agent is a peer, so its success body is remote input: it must be a JSON object whose ``reward`` is a
number (or null) and whose ``hops`` are ``[role, seconds]`` pairs. Anything else fails that rollout with a
``protocol_violation`` saying what was wrong -- it never raises out of the driver and ends the run. The
failures the agent recovered from travel in its ``X-NG-Failure-Report`` header and are decoded through the
public failures API (validated and bounded there: at most ``MAX_EVENTS`` events).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from gym_obs.failures import (
    FAILURE_REPORT_HEADER,
    FailureReport,
    InvalidFailureReport,
    NgFailureEvent,
    decode_failure_report,
)

__all__ = [
    "MAX_HOPS",
    "MAX_ROLE_CHARS",
    "USAGE_KEYS",
    "AgentReply",
    "malformed_reply",
    "parse_agent_reply",
    "recovered_failures",
]

MAX_HOPS: Final = 4096
MAX_ROLE_CHARS: Final = 64
_log = logging.getLogger("gym_obs.harness")
_warned_invalid = False


@dataclass(frozen=True, slots=True)
class AgentReply:
    """What a valid ``/run`` success carried."""

    reward: float | None = None
    hops: list[tuple[str, float]] = field(default_factory=list)
    recovered: FailureReport | None = None
    usage: dict[str, float | int | None] | None = None


#: The per-rollout model-call tallies an agent may report under ``usage`` (``RolloutTally.summary``).
USAGE_KEYS: Final = (
    "input_tokens",
    "output_tokens",
    "model_calls",
    "ttft_p50_s",
    "ttft_p99_s",
    "model_time_s",
    "other_time_s",
)
_COUNT_KEYS: Final = frozenset({"input_tokens", "output_tokens", "model_calls"})


_JSON_TYPES: Final = {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}


def malformed_reply(agent: str, problem: str) -> NgFailureEvent:
    """The failure of a rollout whose agent answered 200 with something that is not the protocol."""
    return NgFailureEvent(
        "protocol_violation",
        f"rollout on {agent}: the HTTP 200 reply {problem}",
        boundary="harness",
        stage="agent",
        http_status=200,
    )


def recovered_failures(headers: Mapping[str, str]) -> FailureReport | None:
    """The events of the agent's ``X-NG-Failure-Report`` on a success, or ``None`` (an invalid header is
    logged once and ignored: the rollout itself succeeded)."""
    global _warned_invalid
    value = headers.get(FAILURE_REPORT_HEADER)
    if value is None:
        return None
    try:
        report = decode_failure_report(value)
    except InvalidFailureReport as exc:
        if not _warned_invalid:
            _warned_invalid = True
            _log.warning("ignored an invalid failure report on a successful rollout: %s", exc)
        return None
    return report if report.events else None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _hops(value: object, agent: str) -> list[tuple[str, float]]:
    problem = "has 'hops' that are not a list of [role, seconds] pairs"
    if not isinstance(value, list):
        raise malformed_reply(agent, problem)
    if len(value) > MAX_HOPS:
        raise malformed_reply(agent, f"has more than {MAX_HOPS} 'hops'")
    hops: list[tuple[str, float]] = []
    for item in value:
        if not isinstance(item, list | tuple) or len(item) != 2:
            raise malformed_reply(agent, problem)
        role, seconds = item
        number = _number(seconds)
        if not isinstance(role, str) or not role or len(role) > MAX_ROLE_CHARS or not role.isprintable():
            raise malformed_reply(agent, f"has a hop role that is not a short printable name ({problem})")
        if number is None or number < 0:
            raise malformed_reply(agent, problem)
        hops.append((role, number))
    return hops


def parse_agent_reply(body: Any, agent: str, recovered: FailureReport | None = None) -> AgentReply:
    """Validate a decoded ``/run`` body; raises the :func:`malformed_reply` event for a bad one."""
    if not isinstance(body, dict):
        raise malformed_reply(agent, f"is a JSON {_JSON_TYPES.get(type(body), 'null')}, not an object")
    reward = body.get("reward")
    if reward is not None and _number(reward) is None:
        raise malformed_reply(agent, "has a 'reward' that is not a finite number or null")
    hops = _hops(body["hops"], agent) if "hops" in body else []
    usage = _usage(body["usage"], agent) if "usage" in body else None
    return AgentReply(reward=_number(reward), hops=hops, recovered=recovered, usage=usage)


def _usage(value: object, agent: str) -> dict[str, float | int | None]:
    """The reply's ``usage``: known keys only, each a non-negative number (counts: integers) or null."""
    if not isinstance(value, dict):
        raise malformed_reply(agent, "has a 'usage' that is not an object")
    usage: dict[str, float | int | None] = {}
    for key in USAGE_KEYS:
        item = value.get(key)
        number = _number(item)
        if item is None:
            usage[key] = None
        elif number is None or number < 0 or (key in _COUNT_KEYS and type(item) is not int):
            raise malformed_reply(agent, f"has a 'usage.{key}' that is not a non-negative number")
        else:
            usage[key] = item if key in _COUNT_KEYS else number
    return usage
