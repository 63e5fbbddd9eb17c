"""The text frame of ``gym-obs top``: plain lines, fixed columns, nothing remote printed unescaped."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Final

from gym_obs.telemetry.redaction import escape_controls

__all__ = ["render_text"]

_ID_WIDTH: Final = 36
_ROWS_HEADER: Final = (
    f"  {'AGENT':<16} {'ROLLOUT':<{_ID_WIDTH}} {'STAGE':<13} {'ELAPSED':>8} {'IDLE':>7}  HOPS"
)


def _safe(value: object, width: int | None = None) -> str:
    text = escape_controls(str(value))
    if width is not None and len(text) > width:
        text = text[: width - 1] + "…"
    return text


def _seconds(value: float) -> str:
    if value >= 3600:
        return f"{value / 3600:.1f}h"
    if value >= 60:
        return f"{value / 60:.1f}m"
    return f"{value:.1f}s"


def _counts(title: str, counts: Mapping[str, int]) -> str:
    if not counts:
        return f"{title}: -"
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return f"{title}: " + "  ".join(f"{_safe(name, 32)} {count}" for name, count in ordered)


def _hops(row: Mapping[str, Any]) -> str:
    hops = [f"{_safe(h['server'], 24)}#{h['attempt']}" for h in row["hops"]]
    more = row["hops_in_flight"] - len(hops)
    text = " ".join(hops) + (f" +{more}" if more > 0 else "")
    return text or "-"


def _rows(title: str, rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return [f"{title}: none"]
    lines = [f"{title}:", _ROWS_HEADER]
    for row in rows:
        flags = ("  STALLED" if row["stalled"] else "") + ("  RETRYING" if row["retrying"] else "")
        lines.append(
            f"  {_safe(row['agent'], 16):<16} {_safe(row['rollout_id'], _ID_WIDTH):<{_ID_WIDTH}} "
            f"{_safe(row['stage'], 13):<13} {_seconds(row['elapsed_s']):>8} "
            f"{_seconds(row['since_progress_s']):>7}  {_hops(row)}{flags}"
        )
    return lines


def render_text(view: Mapping[str, Any]) -> str:
    """One frame of the live view from :meth:`TopView.as_json`."""
    clock = time.strftime("%H:%M:%S", time.localtime(view["at"]))
    stall = f"stalled = idle >= {view['stall_after_s']:g}s"
    lines = [f"gym-obs top   head {_safe(view['head'], 80)}   {clock}   {stall}"]
    if view["head_error"] is not None:
        lines.append(f"head server: {_safe(view['head_error'])}")
        return "\n".join(lines)
    agents = view["agents"]
    if not agents:
        lines.append("no agent servers known to the head server")
    for agent in agents:
        name = _safe(agent["name"], 32)
        if agent["answered"]:
            extra = f", {agent['evicted']} not tracked (table full)" if agent["evicted"] else ""
            lines.append(f"agent {name}: {agent['in_flight']} in flight{extra}")
        else:
            lines.append(f"agent {name}: {_safe(agent['error'])}")
    lines.append(
        f"in flight {view['in_flight']}   stalled {view['stalled_count']}   retrying {view['retrying_count']}"
    )
    lines.append(_counts("by stage", view["by_stage"]))
    lines.append(_counts("hops in flight by server", view["hops_by_server"]))
    lines += _rows("oldest", view["oldest"])
    lines += _rows("stalled", view["stalled"])
    lines += _rows("retrying", view["retrying"])
    return "\n".join(lines)
