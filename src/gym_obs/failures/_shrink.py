"""The stated rule for cutting a report down to size (event count or encoded bytes).

Drop order, first dropped first:

1. Secondary events — those not on the final failure's cause chain (recovered failures, exception-group
   siblings, wrappers above the final failure) — chain by chain, newest chain first; within a chain the
   middle events go first (centre outwards), then its root, then its head.
2. The middle of the final failure's chain, centre outwards, so the events nearest the final failure and
   nearest the root cause are kept longest.

The final failure and its root cause are never dropped. Dropping an event relinks every event that named it
as its cause to the dropped event's own cause and adds the number of events cut out to that record's
``skipped`` count, so every link stays valid and every gap is visible.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

Events = Mapping[str, dict[str, Any]]


def final_chain(events: Events, failure_id: str | None) -> list[str]:
    """Event ids from the final failure down to its root cause (empty without a final failure)."""
    chain: list[str] = []
    node = failure_id
    seen: set[str] = set()
    while node is not None and node in events and node not in seen:
        chain.append(node)
        seen.add(node)
        node = events[node]["cause_id"]
    return chain


def drop_order(events: Events, failure_id: str | None) -> list[str]:
    """Every droppable event id, in the order the module docstring states."""
    chain = final_chain(events, failure_id)
    assigned = set(chain)
    referenced = {record["cause_id"] for record in events.values() if record["cause_id"] is not None}
    heads = [eid for eid in events if eid not in assigned and eid not in referenced]
    order: list[str] = []
    for head in reversed(heads):
        sub: list[str] = []
        node: str | None = head
        while node is not None and node in events and node not in assigned:
            sub.append(node)
            assigned.add(node)
            node = events[node]["cause_id"]
        order.extend(_centre_out(sub[1:-1]))
        if len(sub) > 1:
            order.append(sub[-1])
        order.append(sub[0])
    # Only reachable through a cycle (never in a validated map); listed so nothing is left undroppable.
    order.extend(eid for eid in events if eid not in assigned)
    order.extend(_centre_out(chain[1:-1]))
    return order


def apply_drops(events: Events, dropped: Collection[str]) -> dict[str, dict[str, Any]]:
    """``events`` without ``dropped``: links across a gap are rejoined and counted in ``skipped``."""
    if not dropped:
        return {eid: dict(record) for eid, record in events.items()}
    out: dict[str, dict[str, Any]] = {}
    for eid, record in events.items():
        if eid in dropped:
            continue
        cause = record["cause_id"]
        extra = 0
        hops = 0
        while cause is not None and cause in dropped and hops <= len(events):
            gone = events[cause]
            extra += 1 + gone.get("skipped", 0)
            cause = gone["cause_id"]
            hops += 1
        copy = dict(record)
        if extra:
            copy["cause_id"] = cause
            copy["skipped"] = record.get("skipped", 0) + extra
        out[eid] = copy
    return out


def trim_to_count(
    events: Events, failure_id: str | None, max_events: int
) -> tuple[dict[str, dict[str, Any]], int]:
    """``events`` cut to ``max_events`` by the drop order; returns the map and how many were dropped."""
    excess = len(events) - max_events
    if excess <= 0:
        return dict(events), 0
    order = drop_order(events, failure_id)[:excess]
    return apply_drops(events, set(order)), len(order)


def _centre_out(items: list[str]) -> list[str]:
    middle = (len(items) - 1) / 2
    return [items[i] for i in sorted(range(len(items)), key=lambda i: (abs(i - middle), i))]
