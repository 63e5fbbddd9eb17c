"""The fleet tier, proven: two ``agent.yaml`` collectors load-balancing to two ``gateway.yaml`` collectors.

Both tiers run the SHIPPED files; ``--set`` moves only addresses, the gateways' ``decision_wait`` (15 s ->
3 s, so the test waits 3 s for each decision instead of 15; the policies are untouched) and, in part 1,
the agents' resolver. Each gateway exports its kept traces to its own Jaeger, so which gateway kept what is
observable; both remote-write metrics to one Prometheus (``--web.enable-remote-write-receiver``).

Part 1 (a static resolver list, as a test can give one): two harness runs, one per agent, at the same time.
Every trace arrives whole on exactly one gateway; every trace with an error span is kept; OK traces are
kept at the configured rate (10 %, accepted between 3 % and 20 %: a binomial of 160 traces stays in it
with probability > 0.99); remote-written metrics reach Prometheus with ``job`` = ``service.name``, once.

Part 2 (the SHIPPED DNS resolver): each agent runs in a private mount namespace whose ``/etc/hosts`` gives
``otel-gateway`` one address per gateway, as a headless service would. A gateway is SIGKILLed mid-run and
its address leaves the name, as a Kubernetes endpoint does when its pod dies: the agents keep accepting,
route to the survivor, and the test measures what was lost (printed; only traces in flight to the dead
gateway).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gym_obs import dashboards
from gym_obs.telemetry import names
from tests.e2e.collector_stack import (
    COLLECTOR_DIR,
    Jaeger,
    Process,
    http_get,
    otelcol,
    run_jaeger,
    run_process,
    run_prometheus_with,
    set_flags,
    telemetry_port_override,
    trace_problems,
    wait_until,
)
from tests.e2e.promql_check import PrometheusAPI
from tests.e2e.test_dashboards_real_data import SERVICES, _stop_harness

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

GATEWAY_HOSTS = ("127.0.0.2", "127.0.0.3")  # one loopback address per gateway: a DNS name can list both
GATEWAY_GRPC = 30121
GATEWAY_HEALTH = (30122, 30132)
GATEWAY_TELEMETRY = (30123, 30133)
AGENT_PORTS = ((30101, 30102, 30103, 30104), (30111, 30112, 30113, 30114))  # gRPC, HTTP, health, telemetry
JAEGER_PORTS = ((30141, 30142, 30143, 30144), (30151, 30152, 30153, 30154))
PROMETHEUS_LISTEN = "127.0.0.1:30160"
HARNESS_PORT_BASES = (30200, 30220, 30240)
DECISION_WAIT_S = 3
SAMPLING_PERCENT = 10  # gateway.yaml's probabilistic policy (a unit test reads it from the file)
OK_RATIO_TOLERANCE = (0.03, 0.20)
FAULTS = [
    {"server": "resources", "route": "/verify", "rate": 0.3, "action": "raise", "exception": "KeyError"}
]
# After the kill the name drops the dead gateway; the agents re-resolve every 1 s (--set) and Go re-reads
# /etc/hosts at most every 5 s: 10 s bounds (with room for a loaded machine) the time the agents may still
# route to the dead gateway.
REROUTE_S = 10
RESOLVER_KEYS = ("exporters::loadbalancing::resolver", "exporters::loadbalancing/metrics::resolver")


# --- the two tiers ------------------------------------------------------------------------------------------


def gateway_overrides(index: int) -> dict[str, Any]:
    return {
        "receivers::otlp::protocols::grpc::endpoint": f"{GATEWAY_HOSTS[index]}:{GATEWAY_GRPC}",
        "exporters::otlp/tempo::endpoint": f"127.0.0.1:{JAEGER_PORTS[index][0]}",
        "exporters::prometheusremotewrite::endpoint": f"http://{PROMETHEUS_LISTEN}/api/v1/write",
        "processors::tail_sampling::decision_wait": f"{DECISION_WAIT_S}s",
        **telemetry_port_override(GATEWAY_TELEMETRY[index]),
    }


def agent_overrides(index: int, *, static: bool) -> dict[str, Any]:
    grpc, http, _, telemetry = AGENT_PORTS[index]
    overrides: dict[str, Any] = {
        "receivers::otlp::protocols::grpc::endpoint": f"127.0.0.1:{grpc}",
        "receivers::otlp::protocols::http::endpoint": f"127.0.0.1:{http}",
        **telemetry_port_override(telemetry),
    }
    for key in RESOLVER_KEYS:
        if static:
            # --set merges into the file: `enabled: false` turns the shipped DNS resolver off (an optional
            # section), and the static list takes its place.
            overrides[f"{key}::dns::enabled"] = False
            overrides[f"{key}::static::hostnames"] = [f"{host}:{GATEWAY_GRPC}" for host in GATEWAY_HOSTS]
        else:
            overrides[f"{key}::dns::port"] = json.dumps(str(GATEWAY_GRPC))  # a YAML string, as shipped
            overrides[f"{key}::dns::interval"] = "1s"
    return overrides


@contextlib.contextmanager
def run_agent(index: int, work: Path, *, hosts: Path | None = None) -> Iterator[Process]:
    """An ``agent.yaml`` collector; with ``hosts``, in a private mount namespace seeing it as /etc/hosts."""
    argv = [
        str(otelcol()),
        f"--config={COLLECTOR_DIR / 'agent.yaml'}",
        *set_flags(
            {
                "extensions::health_check::endpoint": f"127.0.0.1:{AGENT_PORTS[index][2]}",
                **agent_overrides(index, static=hosts is None),
            }
        ),
    ]
    if hosts is not None:
        unshare = shutil.which("unshare")
        assert unshare, "unshare (util-linux) is needed to give an agent its own /etc/hosts"
        argv = [
            unshare,
            "--mount",
            "--",
            "sh",
            "-c",
            f'mount --bind "{hosts}" /etc/hosts && exec "$@"',
            "agent",
            *argv,
        ]
    health = f"http://127.0.0.1:{AGENT_PORTS[index][2]}/"
    with run_process(f"agent{index}{'-dns' if hosts else ''}", argv, work, health) as process:
        yield process


@contextlib.contextmanager
def run_gateway(index: int, work: Path) -> Iterator[Process]:
    argv = [
        str(otelcol()),
        f"--config={COLLECTOR_DIR / 'gateway.yaml'}",
        *set_flags(
            {
                "extensions::health_check::endpoint": f"127.0.0.1:{GATEWAY_HEALTH[index]}",
                **gateway_overrides(index),
            }
        ),
    ]
    with run_process(f"gateway{index}", argv, work, f"http://127.0.0.1:{GATEWAY_HEALTH[index]}/") as process:
        yield process


def collector_counter(port: int, name: str) -> float:
    """Sum of one counter on a collector's own /metrics (0 when it was never incremented)."""
    status, body = http_get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200, f"no telemetry on :{port}"
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.decode().splitlines()
        if line.startswith(name) and line[len(name)] in "{ "
    )


def dropped_in_log(process: Process) -> int:
    """Items a collector said it dropped (``Exporting failed. Dropping data.`` with ``dropped_items``)."""
    total = 0
    for line in process.log.read_text(errors="replace").splitlines():
        if "Dropping data" in line:
            match = re.search(r'"dropped_items": (\d+)', line)
            total += int(match.group(1)) if match else 0
    return total


# --- harness runs -------------------------------------------------------------------------------------------


def start_harness(
    work: Path, name: str, agent: int, port_base: int, args: Sequence[str]
) -> subprocess.Popen[bytes]:
    out = work / name
    plan = work / "faults.yaml"
    plan.write_text(json.dumps({"faults": FAULTS}))  # JSON is YAML
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    command = [
        sys.executable,
        "-m",
        "gym_obs.cli",
        "harness",
        "run",
        "--out",
        str(out),
        "--faults",
        str(plan),
        f"--port-base={port_base}",
        f"--otlp-endpoint=http://127.0.0.1:{AGENT_PORTS[agent][1]}",
        *args,
    ]
    with (work / f"{name}.stdout").open("wb") as stdout, (work / f"{name}.stderr").open("wb") as stderr:
        return subprocess.Popen(command, cwd=work, env=env, stdout=stdout, stderr=stderr)


def finish(
    process: subprocess.Popen[bytes], work: Path, name: str, timeout_s: float = 120
) -> list[dict[str, Any]]:
    try:
        process.wait(timeout=timeout_s)
    finally:
        returncode = _stop_harness(process)
    assert returncode == 0, (work / f"{name}.stderr").read_text()[-3000:]
    rows = (work / name / "latest" / "rollouts.jsonl").read_text().splitlines()  # the run's own folder
    return [json.loads(line) for line in rows]


def kept(jaeger: Jaeger) -> set[str]:
    """Every trace id the store holds, found from any of the four processes (a split trace shows too)."""
    return set().union(*(jaeger.trace_ids(service) for service in SERVICES))


@dataclass
class Outcome:
    rows: list[dict[str, Any]]
    stores: tuple[set[str], ...]

    @property
    def failed(self) -> set[str]:
        return {row["trace_id"] for row in self.rows if row["outcome"] == names.ROLLOUT_OUTCOME_FAILED}

    @property
    def ok(self) -> set[str]:
        return {row["trace_id"] for row in self.rows} - self.failed

    @property
    def anywhere(self) -> set[str]:
        return set().union(*self.stores)


def settle(jaegers: Sequence[Jaeger], rows: list[dict[str, Any]]) -> Outcome:
    """Poll the stores until no count changed for longer than a decision takes (``decision_wait`` + 2 s)."""
    traces = {row["trace_id"] for row in rows}
    previous: tuple[int, ...] = ()
    changed = time.monotonic()

    def stable() -> bool:
        nonlocal previous, changed
        counts = tuple(len(kept(jaeger) & traces) for jaeger in jaegers)
        if counts != previous:
            previous, changed = counts, time.monotonic()
        return sum(counts) > 0 and time.monotonic() - changed > DECISION_WAIT_S + 2

    wait_until("stable trace stores", stable, timeout_s=60)
    return Outcome(rows, tuple(kept(jaeger) & traces for jaeger in jaegers))


# --- the test -----------------------------------------------------------------------------------------------


def test_fleet_traces_whole_sampled_metrics_once_and_a_gateway_dies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report: dict[str, Any] = {}
    try:
        run_fleet(tmp_path, report)
    finally:
        with capsys.disabled():  # the measurements belong in the test output, pass or fail
            print("\nfleet measurements (collector/README.md quotes them): " + json.dumps(report, indent=2))


def run_fleet(tmp_path: Path, report: dict[str, Any]) -> None:
    with contextlib.ExitStack() as stack:
        jaegers = [stack.enter_context(run_jaeger(f"jaeger{i}", tmp_path, JAEGER_PORTS[i])) for i in (0, 1)]
        prometheus = stack.enter_context(
            run_prometheus_with(
                {"global": {"scrape_interval": "5s"}},
                tmp_path,
                PROMETHEUS_LISTEN,
                ["--web.enable-remote-write-receiver"],
            )
        )
        gateways = [stack.enter_context(run_gateway(i, tmp_path)) for i in (0, 1)]

        # Part 1: a static resolver, two harness runs at once, one per agent.
        with run_agent(0, tmp_path) as agent0, run_agent(1, tmp_path) as agent1:
            args = ("--rollouts=120", "--concurrency=8", "--seed=11")
            runs = [start_harness(tmp_path, f"run{i}", i, HARNESS_PORT_BASES[i], args) for i in (0, 1)]
            for process in runs:
                stack.callback(_stop_harness, process)
            rows = finish(runs[0], tmp_path, "run0") + finish(runs[1], tmp_path, "run1")
            outcome = settle(jaegers, rows)
            check_part_one(outcome, jaegers, report)
            check_remote_write(PrometheusAPI(prometheus), rows, report)
            assert agent0.alive() and agent1.alive()

        # Part 2: the shipped DNS resolver; gateway 1 dies mid-run.
        hosts = tmp_path / "hosts"
        hosts.write_text("".join(f"{host} otel-gateway\n" for host in GATEWAY_HOSTS))
        with run_agent(0, tmp_path, hosts=hosts) as agent0:
            refused_before = collector_counter(AGENT_PORTS[0][3], "otelcol_receiver_refused_spans")
            run = start_harness(
                tmp_path,
                "run2",
                0,
                HARNESS_PORT_BASES[2],
                ("--rollouts=500", "--concurrency=4", "--seed=12", "--model-latency-ms=40"),
            )
            stack.callback(_stop_harness, run)  # a failure before finish() still stops the run
            rollouts = tmp_path / "run2" / "latest" / "rollouts.jsonl"
            wait_until(
                "60 rollouts before the kill",
                lambda: rollouts.exists() and len(rollouts.read_text().splitlines()) >= 60,
                90,
                watch=[agent0, *gateways],
            )
            gateways[1].kill()
            killed_at = time.time()
            with hosts.open("r+") as file:  # in place: the bind mount follows the inode
                file.write(f"{GATEWAY_HOSTS[0]} otel-gateway\n")
                file.truncate()
            rows = finish(run, tmp_path, "run2")
            survivor = settle(jaegers[:1], rows).stores[0]  # only the survivor's store can still change
            outcome = Outcome(rows, (survivor, kept(jaegers[1]) & {row["trace_id"] for row in rows}))
            refused = collector_counter(AGENT_PORTS[0][3], "otelcol_receiver_refused_spans") - refused_before
            dropped = dropped_in_log(agent0)
            check_part_two(outcome, jaegers, rows, killed_at, refused, dropped, report, agent0)
        assert gateways[0].alive()


def check_part_one(outcome: Outcome, jaegers: Sequence[Jaeger], report: dict[str, Any]) -> None:
    stores = outcome.stores
    assert stores[0] and stores[1], f"one gateway got nothing: {len(stores[0])} / {len(stores[1])}"
    assert not stores[0] & stores[1], f"traces split across gateways: {sorted(stores[0] & stores[1])[:5]}"
    broken = {}
    for index, store in enumerate(stores):
        for trace_id in store:
            problems = trace_problems(jaegers[index].trace(trace_id) or [], SERVICES)
            if problems:
                broken[trace_id] = problems
    assert broken == {}, "kept traces with missing parts"
    assert outcome.failed, "the fault plan failed no rollout"
    missing = outcome.failed - outcome.anywhere
    assert missing == set(), f"{len(missing)} failed rollouts' traces were sampled away"
    for trace_id in sorted(outcome.failed)[:5]:
        store = 0 if trace_id in stores[0] else 1
        assert any(span.error for span in jaegers[store].trace(trace_id) or [])
    ok_kept = outcome.ok & outcome.anywhere
    ratio = len(ok_kept) / len(outcome.ok)
    report["part1"] = {
        "rollouts": len(outcome.rows),
        "failed": len(outcome.failed),
        "ok": len(outcome.ok),
        "kept_by_gateway": [len(stores[0]), len(stores[1])],
        "split_traces": 0,
        "incomplete_kept_traces": 0,
        "failed_kept": len(outcome.failed & outcome.anywhere),
        "ok_kept": len(ok_kept),
        "ok_kept_ratio": round(ratio, 4),
        "configured_ratio": SAMPLING_PERCENT / 100,
        "accepted_ratio_range": OK_RATIO_TOLERANCE,
    }
    low, high = OK_RATIO_TOLERANCE
    assert low <= ratio <= high, report["part1"]


def check_remote_write(api: PrometheusAPI, rows: list[dict[str, Any]], report: dict[str, Any]) -> None:
    rollouts = dashboards.ROLLOUTS.series()

    def total() -> float:
        result = api.query(f"sum({rollouts})", at=time.time())["result"]
        return float(result[0]["value"][1]) if result else 0.0

    wait_until(f"{len(rows)} rollouts remote-written by the gateways", lambda: total() >= len(rows), 60)
    assert total() == len(rows)  # every rollout counted once: no series written twice
    jobs = {s["metric"]["job"] for s in api.query("count by (job) (target_info)", at=time.time())["result"]}
    assert jobs == SERVICES
    per_process = api.query("count by (job, instance) (target_info)", at=time.time())["result"]
    assert len(per_process) == 2 * len(SERVICES)  # two runs x four processes, each one series
    assert {float(s["value"][1]) for s in per_process} == {1.0}
    failed_points = sum(
        collector_counter(port, "otelcol_exporter_send_failed_metric_points") for port in GATEWAY_TELEMETRY
    )
    assert (
        failed_points == 0
    )  # Prometheus refused nothing (out-of-order samples from a second writer would be)
    report["remote_write"] = {
        "rollouts_counted": total(),
        "jobs": sorted(jobs),
        "series_per_process": 1,
        "failed_points": failed_points,
    }


def _classify(trace_id: str, jaegers: Sequence[Jaeger], stores: Sequence[set[str]]) -> str:
    """Where a failed rollout's trace ended up: whole or partial at the survivor or dead gateway, or lost."""
    for index, where in enumerate(("survivor", "dead_gateway")):
        if trace_id in stores[index]:
            whole = not trace_problems(jaegers[index].trace(trace_id) or [], SERVICES)
            return f"{'whole' if whole else 'partial'}_at_{where}"
    return "lost"


def check_part_two(
    outcome: Outcome,
    jaegers: Sequence[Jaeger],
    rows: list[dict[str, Any]],
    killed_at: float,
    refused: float,
    dropped: float,
    report: dict[str, Any],
    agent: Process,
) -> None:
    assert agent.alive()
    assert refused == 0, f"the agent refused {refused} spans after the gateway died"
    started = {row["trace_id"]: row["started_at"] for row in rows}
    places = {trace_id: _classify(trace_id, jaegers, outcome.stores) for trace_id in outcome.failed}
    after = {t for t in outcome.failed if started[t] > killed_at + REROUTE_S}
    assert len(after) >= 20, "the run ended too soon after the kill"
    assert {places[t] for t in after} == {"whole_at_survivor"}, "a trace begun after re-resolving was hurt"
    hurt = {
        t for t, place in places.items() if place != "whole_at_survivor" and place != "whole_at_dead_gateway"
    }
    assert all(started[t] <= killed_at + REROUTE_S for t in hurt), "only traces in flight may be hurt"
    # What the agent had queued for the dead gateway it drops when the resolver removes that backend, and
    # says so (counted below); what the dead gateway held for its pending decisions died with it.
    counts = {place: sum(1 for p in places.values() if p == place) for place in sorted(set(places.values()))}
    report["part2_gateway_killed"] = {
        "rollouts": len(rows),
        "failed": len(outcome.failed),
        "failed_by_place": counts,
        "failed_hurt_share": round(len(hurt) / len(outcome.failed), 4),
        "failed_started_after_kill_plus_reroute": len(after),
        "of_those_whole_at_survivor": len(after),
        "reroute_window_s": REROUTE_S,
        "spans_refused_by_agent": refused,
        "spans_dropped_by_agent_log": dropped,
    }
