"""The process-wide telemetry switch that every instrumented site checks first.

Kept in its own tiny module so that a hot path pays one attribute load (``STATE.enabled``) when telemetry
is off, and so that setup, metrics and spans share one source of truth without importing each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gym_obs.telemetry.groups import DEFAULT_GROUPS, SpanGroups

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

    from gym_obs.telemetry.metrics import Instruments


class TelemetryState:
    """Mutable singleton; written only by ``setup_telemetry``/shutdown (and test helpers)."""

    __slots__ = (
        "enabled",
        "groups",
        "instruments",
        "propagation_targets",
        "server_name",
        "tracer",
        "traces_enabled",
    )

    def __init__(self) -> None:
        self.enabled: bool = False
        self.traces_enabled: bool = False
        self.tracer: Tracer | None = None
        self.instruments: Instruments | None = None
        self.server_name: str | None = None
        self.propagation_targets: frozenset[str] = frozenset()
        # Which kinds of span are created (span groups); each call site checks its flag after ``enabled``.
        self.groups: SpanGroups = DEFAULT_GROUPS

    def snapshot(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    def restore(self, values: dict[str, Any]) -> None:
        for name, value in values.items():
            setattr(self, name, value)


STATE = TelemetryState()
