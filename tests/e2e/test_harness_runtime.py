"""The harness while it runs: load spread over instances, the control route, hangs, and Ctrl-C.

Real ``gym-obs harness run`` subprocesses on loopback ports 29400-29499; assertions on rows, on what the
servers' control routes report, and on /proc (no psutil) for leftover processes.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from gym_obs.telemetry import names
from tests.processes import alive, descendants, wait_until

pytestmark = pytest.mark.e2e


def _command(out: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "gym_obs.cli", "harness", "run", "--out", str(out), *args]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}


def _rows(out: Path) -> list[dict[str, Any]]:
    path = out / "latest" / "rollouts.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def _control(port: int, method: str = "GET", plan: dict[str, Any] | None = None) -> dict[str, Any]:
    data = None if plan is None else json.dumps(plan).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/_gym/faults", data=data, method=method)
    with urllib.request.urlopen(request, timeout=5) as response:
        body: dict[str, Any] = json.loads(response.read())
    return body


def test_spread_control_route_and_ctrl_c(tmp_path: Path) -> None:
    out = tmp_path / "out"
    base = 29400  # head 29400, agents 29401-2, models 29403-4, resources 29405-6
    command = _command(
        out,
        *("--rollouts", "100000", "--concurrency", "8", "--port-base", str(base)),
        *("--agents", "2", "--models", "2", "--resources", "2", "--seed", "1"),
    )
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        wait_until(lambda: len(_rows(out)) >= 20, 40, "the first rollouts")
        children = descendants(process.pid)
        assert len(children) >= 7  # head server + six demo servers
        # the control route switches faults at run time, per server: model_0 fails, the others mark traffic
        delay = {"route": "*", "action": "delay", "seconds": 0.001}
        status = {"server": "model_0", "route": "/v1/responses", "action": "status", "status": 503}
        assert _control(base + 3, "POST", {"faults": [status]})["plan"]["faults"][0]["status"] == 503
        for port, role in ((base + 4, "model"), (base + 5, "resources"), (base + 6, "resources")):
            _control(port, "PUT", {"faults": [{"server": role, **delay}]})
        seen = len(_rows(out))
        wait_until(
            lambda: any(
                r.get("root_cause", {}).get("kind") == "provider_unavailable" for r in _rows(out)[seen:]
            ),
            20,
            "a failure injected through the control route",
        )
        assert _control(base + 3, "DELETE")["plan"] == {"faults": []}
        # every instance of every role got traffic
        assert _control(base + 3)["injected"]["status"] > 0
        for port in (base + 4, base + 5, base + 6):
            wait_until(
                lambda port=port: _control(port)["injected"].get("delay", 0) > 0, 10, f"traffic on {port}"
            )
        assert {r["agent"] for r in _rows(out)} == {"agent_0", "agent_1"}
        # a bad plan is refused with a clear reason and leaves the active plan alone
        with pytest.raises(urllib.error.HTTPError) as info:
            _control(base + 4, "POST", {"faults": [{"server": "model", "route": "/x", "action": "explode"}]})
        assert info.value.code == 422 and "faults[0].action" in info.value.read().decode()
        assert _control(base + 4)["plan"]["faults"][0]["action"] == "delay"
    finally:
        process.send_signal(signal.SIGINT)  # Ctrl-C
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 130, stderr[-2000:]
    assert "interrupted" in stderr and "Traceback" not in stderr
    time.sleep(0.2)
    assert [pid for pid in children if alive(pid)] == []
    for port in range(base, base + 7):  # every server's port is free again
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))


def test_hangs_are_bounded_failure_rows(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        json.dumps(
            {
                "faults": [
                    {"server": "agent", "route": "/run", "rate": 0.5, "action": "hang"},
                    {"server": "model", "route": "/v1/responses", "rate": 1.0, "action": "hang"},
                ]
            }
        )
    )
    out = tmp_path / "out"
    started = time.monotonic()
    done = subprocess.run(
        _command(
            out,
            *("--rollouts", "6", "--concurrency", "6", "--faults", str(plan), "--seed", "2"),
            *("--request-timeout", "0.5", "--port-base", "29450"),
        ),
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    assert elapsed < 25  # every hang ended at a timeout; nothing waited for the hour a hang lasts
    rows = _rows(out)
    assert len(rows) == 6 and all(r["outcome"] == names.ROLLOUT_OUTCOME_FAILED for r in rows)
    roots = {(r["root_cause"]["kind"], r["root_cause"]["boundary"]) for r in rows}
    # a hung agent: the driver's bounded wait; a hung model: the agent's call timeout, with its root cause
    assert roots == {("agent_timeout", "harness"), ("transport_timeout", "model")}, roots
    for row in rows:
        assert row["_ng_failure_id"] in row["_ng_failure_events"] and row["trace_id"]
    summary = json.loads((out / "latest" / "summary.json").read_text())
    assert summary["retries"]["by_reason"].get(names.RETRY_REASON_TIMEOUT, 0) > 0
    # Every model call hangs, so no request reaches the resources server: the only spans it writes are its
    # part of the startup trace (issue 16.2: one gym.startup.process span and its stages, which join the
    # driver's gym.startup trace); no SERVER span (the harness's own /_gym/faults calls make none there).
    telemetry = out / "latest" / "telemetry"
    _check_telemetry_files(telemetry, {"gym_harness", "gym_agent_0", "gym_model_0", "gym_resources_0"})
    resources_spans = _span_names(telemetry.glob("gym_resources_0*.traces.jsonl"))
    assert sorted(resources_spans) == sorted(
        [names.SPAN_STARTUP_PROCESS]
        + [names.SPAN_STARTUP_STAGE_PREFIX + stage for stage in names.STARTUP_PROCESS_STAGES]
    )
    driver_spans = _span_names(telemetry.glob("gym_harness*.traces.jsonl"))
    assert driver_spans.count(names.SPAN_STARTUP) == 1


def _span_names(paths: Any) -> list[str]:
    found = []
    for path in paths:
        for line in path.read_text().splitlines():
            for resource in json.loads(line)["resourceSpans"]:
                for scope in resource["scopeSpans"]:
                    found.extend(span["name"] for span in scope["spans"])
    return found


def _check_telemetry_files(directory: Path, processes: set[str]) -> None:
    """Embedded default: per process, OTLP/JSON lines as the Collector's file exporter writes them."""
    hex_id = re.compile(r"^[0-9a-f]{32}$|^[0-9a-f]{16}$")
    stems = {path.name.split("-")[0] for path in directory.iterdir()}
    assert stems == processes
    for path in directory.iterdir():
        key = "resourceSpans" if path.name.endswith(".traces.jsonl") else "resourceMetrics"
        lines = path.read_text().splitlines()
        assert lines, path
        for line in lines:
            doc = json.loads(line)  # every line parses
            assert set(doc) == {key}, path
            if key == "resourceSpans":
                for scope in doc[key][0]["scopeSpans"]:
                    for span in scope["spans"]:
                        ids = [span["traceId"], span["spanId"], span.get("parentSpanId") or "0" * 16]
                        assert all(hex_id.match(i) for i in ids), span
