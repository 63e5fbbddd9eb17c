"""Span groups and presets: which kinds of span a process creates, chosen by config or environment.

Telemetry on/off is too coarse for a fleet of hundreds of servers: people want the spine of a trace (SERVER
and CLIENT spans) without paying for one span per model call, or each rollout as its own trace. A group is
a kind of span; a preset is a named set of groups. The spec is case-insensitive and comma-separated, presets
and groups mixed (``"default,model_call"``). A name nobody knows is an error naming every valid one, so a
typo never silently switches tracing off.

A call site checks one attribute of the process's :class:`SpanGroups` (``groups.model_call``) before it
creates a span: a disabled group's spans are never created, not created and dropped. Metrics do not depend
on groups; they keep flowing while their spans are off. ``concurrency`` names admission-control telemetry,
which is metrics only today: it is accepted so that presets and configs can name it.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "DEFAULT_GROUPS",
    "DEFAULT_SPEC",
    "GROUPS",
    "PRESETS",
    "SPINE_GROUPS",
    "SpanGroups",
    "UnknownSpanGroup",
    "parse_span_groups",
]

GROUPS: Final = ("server", "http_client", "rollout", "model_call", "verify", "startup", "concurrency")

PRESETS: Final[dict[str, frozenset[str]]] = {
    "default": frozenset({"server", "http_client", "rollout", "startup"}),
    "per_rollout": frozenset(GROUPS) - {"startup"},
    "all": frozenset(GROUPS),
    "none": frozenset(),
}

# The groups whose spans join processes into one trace: without them, traces break apart.
SPINE_GROUPS: Final = ("server", "http_client")

DEFAULT_SPEC: Final = "default"


class UnknownSpanGroup(ValueError):
    """A span-group spec named something that is neither a group nor a preset."""


class SpanGroups:
    """Immutable set of enabled span groups, one boolean attribute per group (the call-site flag)."""

    __slots__ = ("enabled", "preset", *GROUPS)

    enabled: frozenset[str]
    preset: str | None
    server: bool
    http_client: bool
    rollout: bool
    model_call: bool
    verify: bool
    startup: bool
    concurrency: bool

    def __init__(self, enabled: frozenset[str], preset: str | None = None) -> None:
        unknown = enabled - set(GROUPS)
        if unknown:
            raise UnknownSpanGroup(_unknown_message(sorted(unknown)))
        object.__setattr__(self, "enabled", enabled)
        # ``per_rollout`` also changes how rollout spans are parented: each rollout is its own root trace.
        object.__setattr__(self, "preset", preset)
        for group in GROUPS:
            object.__setattr__(self, group, group in enabled)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("SpanGroups is immutable")

    @property
    def rollout_is_root(self) -> bool:
        """True when each rollout starts its own trace (the ``per_rollout`` preset was named)."""
        return self.preset == "per_rollout"

    def missing_spine(self) -> tuple[str, ...]:
        """The spine groups switched off: traces break apart at every hop when any is missing."""
        return tuple(group for group in SPINE_GROUPS if group not in self.enabled)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SpanGroups) and (self.enabled, self.preset) == (other.enabled, other.preset)

    def __hash__(self) -> int:
        return hash((self.enabled, self.preset))

    def __repr__(self) -> str:
        return f"SpanGroups({','.join(g for g in GROUPS if g in self.enabled) or 'none'})"


def parse_span_groups(spec: str | None) -> SpanGroups:
    """Parse ``"default,model_call"``-style specs; ``None`` or blank means the ``default`` preset.

    Raises :class:`UnknownSpanGroup` listing the valid names when any name is unknown.
    """
    text = DEFAULT_SPEC if spec is None or not spec.strip() else spec
    enabled: set[str] = set()
    preset: str | None = None
    unknown: list[str] = []
    for raw in text.split(","):
        name = raw.strip().lower()
        if not name:
            continue
        if name in PRESETS:
            enabled |= PRESETS[name]
            if name == "per_rollout":
                preset = name
        elif name in GROUPS:
            enabled.add(name)
        else:
            unknown.append(raw.strip())
    if unknown:
        raise UnknownSpanGroup(_unknown_message(unknown))
    return SpanGroups(frozenset(enabled), preset)


def _unknown_message(unknown: list[str]) -> str:
    shown = ", ".join(repr(name[:40]) for name in unknown[:5])
    return (
        f"unknown span group {shown}; valid groups: {', '.join(GROUPS)}; "
        f"valid presets: {', '.join(PRESETS)}"
    )


DEFAULT_GROUPS: Final = parse_span_groups(DEFAULT_SPEC)
