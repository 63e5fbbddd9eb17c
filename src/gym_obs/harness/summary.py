"""The end-of-run summary: outcomes, failures by root cause, latency per hop, retries, pool waits.

Built as one JSON-ready dict (written as ``summary.json``) and rendered from that same dict as rich tables,
so what a user reads and what a script parses cannot disagree.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gym_obs.harness.rows import RolloutResult
from gym_obs.harness.stats import QUANTILE_PRECISION
from gym_obs.harness.tally import RunTally
from gym_obs.harness.telemetry_files import MetricTotals
from gym_obs.telemetry import names

__all__ = ["build_summary", "render_summary", "write_summary"]

_NO_GROUP = "-"


def build_summary(
    results: RunTally | Iterable[RolloutResult],
    *,
    wall_seconds: float,
    run: dict[str, Any],
    metrics: MetricTotals | None,
    role_of: dict[str, str],
    injected: dict[str, dict[str, int]],
) -> dict[str, Any]:
    """Everything the run showed, JSON-ready. ``role_of`` maps server names to roles (agent/model/...).

    ``results`` is the run's :class:`RunTally` (what the driver keeps) or the results themselves. Latency
    quantiles are exact up to ``QUANTILE_PRECISION["exact_up_to"]`` values, else within its relative error.
    """
    tally = results if isinstance(results, RunTally) else RunTally.of(results)
    in_band = tally.hops()
    summary: dict[str, Any] = {
        **run,
        "rollouts": tally.rollouts,
        "wall_seconds": round(wall_seconds, 3),
        "rollouts_per_second": round(tally.rollouts / wall_seconds, 2) if wall_seconds > 0 else None,
        "outcomes": tally.outcome_counts(),
        "rollout_latency_s": tally.latency.summary(),
        "quantile_precision": dict(QUANTILE_PRECISION),
        "failures_by_root_cause": tally.failure_groups(),
        "recovered_failures": tally.recovered_failures,
        "model_calls": tally.model_calls(),
        "faults_injected": injected,
        "hops_source": "in_band",
        "hops": in_band,
        "hops_in_band": in_band,  # measured by the callers, telemetry on or off
        "retries": None,
        "pool_waits": None,
        "failure_events": None,
        "telemetry_processes": 0,
    }
    if metrics is not None and metrics.processes:
        _add_telemetry(summary, metrics, role_of)
    return summary


def _add_telemetry(summary: dict[str, Any], metrics: MetricTotals, role_of: dict[str, str]) -> None:
    summary["telemetry_processes"] = metrics.processes

    def hop(attrs: dict[str, str]) -> str | None:
        destination = attrs.get(names.ATTR_SERVER_NAME)
        if destination is None:
            return None
        return role_of.get(destination, destination)

    by_destination = metrics.histogram_by(names.METRIC_HTTP_CLIENT_REQUEST_DURATION, hop)
    if by_destination:
        hops = {}
        for role, hist in sorted(by_destination.items()):
            caller = "harness" if role == "agent" else "agent"
            hops[f"{caller} -> {role}"] = hist.summary()
        summary["hops"] = hops
        summary["hops_source"] = "telemetry (per attempt)"

    retries = metrics.sum_by(names.METRIC_CLIENT_RETRIES, lambda a: a.get(names.ATTR_RETRY_REASON))
    summary["retries"] = {
        "total": int(sum(retries.values())),
        "by_reason": {reason: int(count) for reason, count in sorted(retries.items())},
    }
    waits = metrics.histogram_by(
        names.METRIC_POOL_WAIT_DURATION,
        lambda a: f"{a.get(names.ATTR_POOL, '?')}/{a.get(names.ATTR_POOL_OUTCOME, '?')}",
    )
    summary["pool_waits"] = {group: hist.summary() for group, hist in sorted(waits.items())}
    events = metrics.sum_by(
        names.METRIC_FAILURE_EVENTS,
        lambda a: "/".join(
            a.get(key, _NO_GROUP)
            for key in (names.ATTR_FAILURE_KIND, names.ATTR_FAILURE_BOUNDARY, names.ATTR_FAILURE_STAGE)
        ),
    )
    summary["failure_events"] = {group: int(count) for group, count in sorted(events.items())}


def write_summary(summary: dict[str, Any], out_dir: Path) -> Path:
    path = out_dir / "summary.json"
    path.write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return path


def _s(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value * 1000:.1f}"
    return str(value)


def _quantile_table(title: str, rows: Iterable[tuple[str, dict[str, Any]]], label: str) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column(label, overflow="fold")
    for column in ("count", "p50 ms", "p90 ms", "p99 ms", "max ms"):
        table.add_column(column, justify="right")
    for name, q in rows:
        table.add_row(
            name,
            str(q.get("count", 0)),
            _s(q.get("p50")),
            _s(q.get("p90")),
            _s(q.get("p99")),
            _s(q.get("max")),
        )
    return table


def _model_calls_table(model: dict[str, Any], console: Console) -> None:
    """Tokens, calls and where the rollouts' time went, as the agents reported them."""
    table = Table(title="Model calls (as the agents saw them)", title_justify="left", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("rollouts reporting", str(model["rollouts_reporting"]))
    table.add_row("model calls", str(model["model_calls"]))
    table.add_row("input tokens", str(model["input_tokens"]))
    table.add_row("output tokens", str(model["output_tokens"]))
    share = model.get("model_time_share")
    table.add_row("time in model calls", f"{model['model_time_s']:.3f} s")
    table.add_row("time elsewhere", f"{model['other_time_s']:.3f} s")
    table.add_row("model-call share", "-" if share is None else f"{100 * share:.1f}%")
    console.print(table)
    ttft = [(f"per-rollout TTFT {q}", model[f"ttft_{q}_s"]) for q in ("p50", "p99")]
    if any(q.get("count") for _, q in ttft):
        console.print(_quantile_table("Time to first token (streamed calls)", ttft, "what"))


def render_summary(summary: dict[str, Any], console: Console) -> None:
    """Print the summary as tables (from the same dict that goes to summary.json)."""
    head = Table(title="Run", title_justify="left", show_header=False)
    head.add_column("key")
    head.add_column("value")
    if summary.get("partial"):
        stopped = summary.get("interrupted", {})
        head.add_row(
            "[bold red]PARTIAL[/]",
            f"stopped early: {summary['rollouts']} of {stopped.get('rollouts_planned', '?')} rollouts "
            f"finished, {stopped.get('cancelled_in_flight', 0)} in flight cancelled",
        )
    head.add_row("rollouts", str(summary["rollouts"]))
    for outcome, count in summary["outcomes"].items():
        head.add_row(f"  {outcome}", str(count))
    if summary.get("recovered_failures"):
        head.add_row("  recovered failures", str(summary["recovered_failures"]))
    head.add_row("wall time", f"{summary['wall_seconds']:.2f} s")
    head.add_row("rate", f"{summary['rollouts_per_second']} rollouts/s")
    head.add_row("telemetry", str(summary.get("telemetry", {}).get("mode", "-")))
    head.add_row("output", str(summary.get("out_dir", "-")))
    console.print(head)
    console.print(_quantile_table("Rollout latency", [("rollout", summary["rollout_latency_s"])], "what"))

    if summary["failures_by_root_cause"]:
        table = Table(title="Failures by root cause", title_justify="left")
        for column in ("root kind", "boundary", "foreign cause", "final kind", "count", "example trace"):
            table.add_column(column, justify="right" if column == "count" else "left", overflow="fold")
        for group in summary["failures_by_root_cause"]:
            table.add_row(
                group["root_kind"],
                group["root_boundary"],
                group["foreign_cause"],
                group["final_kind"],
                str(group["count"]),
                group["example_trace_id"] or "-",
            )
        console.print(table)
    else:
        console.print("Failures by root cause: none")

    console.print(
        _quantile_table(f"Latency per hop ({summary['hops_source']})", summary["hops"].items(), "hop")
    )
    model = summary.get("model_calls")
    if model:
        _model_calls_table(model, console)

    if summary["retries"] is not None:
        table = Table(title="Retries by reason", title_justify="left")
        table.add_column("reason")
        table.add_column("count", justify="right")
        for reason, count in summary["retries"]["by_reason"].items():
            table.add_row(reason, str(count))
        table.add_row("total", str(summary["retries"]["total"]))
        console.print(table)
    if summary["pool_waits"] is not None:
        if summary["pool_waits"]:
            console.print(_quantile_table("Pool waits", summary["pool_waits"].items(), "pool/outcome"))
        else:
            console.print("Pool waits: none (every request found a free pooled connection)")
    if summary["faults_injected"]:
        table = Table(title="Faults injected", title_justify="left")
        table.add_column("server")
        table.add_column("action")
        table.add_column("count", justify="right")
        for server, actions in summary["faults_injected"].items():
            for action, count in actions.items():
                table.add_row(server, action, str(count))
        console.print(table)
