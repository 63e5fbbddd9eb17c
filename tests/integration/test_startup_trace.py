"""Issue 16.2 and 16.4 on real processes: ``gym-obs serve`` emits ONE ``gym.startup`` trace that every
launched server process (each uvicorn worker too) joins, asserted on what a real OTLP receiver got; a
server that exits at startup ends its span with an error naming the exit code and its last log line; the
launcher's process-tree gauges and startup histogram, and every server process's own gauges, are in the
file sink with sane values.

Ports 17200-17299.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gym_obs.telemetry import names
from gym_obs.telemetry.file_export import METRICS_SUFFIX
from tests.integration.otlp_receiver import OtlpReceiver, ReceivedSpan

pytestmark = pytest.mark.integration

APPS = "tests.integration.server_apps"
REPO = Path(__file__).resolve().parents[2]
RECEIVER_PORT = 17200
STATUS_ERROR = 2
LAUNCHER = names.SERVICE_NAME_PREFIX + names.LAUNCHER_SERVICE_NAME


def _config(tmp_path: Path, head_port: int, servers: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(
        f"head_server: {{port: {head_port}}}\n"
        "telemetry:\n"
        "  enabled: true\n"
        "  traces_exporter: otlp\n"
        "  metrics_exporter: file\n"
        f"  otlp_endpoint: http://127.0.0.1:{RECEIVER_PORT}\n"
        "  otlp_protocol: http/protobuf\n"
        "  metric_export_interval_ms: 300\n"
        f"  file_export_dir: {tmp_path / 'telemetry'}\n"
        f"servers:\n{servers}"
    )
    return path


def _serve(config: Path, tmp_path: Path) -> subprocess.Popen[str]:
    paths = [str(REPO / "src"), str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        {
            "PYTHONPATH": os.pathsep.join(paths),
            "COLUMNS": "200",
            "OTEL_BSP_SCHEDULE_DELAY": "50",
            names.ENV_PROCESS_GAUGES: "1",
        }
    )
    return subprocess.Popen(
        [sys.executable, "-m", "gym_obs.cli", "serve", str(config), "--log-dir", str(tmp_path / "logs")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver(RECEIVER_PORT) as running:
        yield running


def _stop(process: subprocess.Popen[str]) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
    try:
        return process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


def _points(directory: Path, service: str) -> dict[str, list[dict[str, Any]]]:
    """Every data point of every export of ``service``'s processes, by metric name."""
    stem = service.replace("/", "_")
    found: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for path in directory.glob(f"{stem}-*{METRICS_SUFFIX}"):
        for line in path.read_text().splitlines():
            for rm in json.loads(line).get("resourceMetrics", ()):
                pid = next(
                    a["value"]["intValue"] for a in rm["resource"]["attributes"] if a["key"] == "process.pid"
                )
                for sm in rm.get("scopeMetrics", ()):
                    for metric in sm.get("metrics", ()):
                        data = metric.get("gauge") or metric.get("sum") or metric.get("histogram") or {}
                        for point in data.get("dataPoints", []):
                            found[metric["name"]].append({**point, "pid": int(pid)})
    return found


def _attrs(point: dict[str, Any]) -> dict[str, Any]:
    return {a["key"]: next(iter(a["value"].values())) for a in point.get("attributes", ())}


def _value(point: dict[str, Any]) -> float:
    return float(point["asDouble"]) if "asDouble" in point else float(point.get("asInt", 0))


def _startup_spans_complete(spans: list[ReceivedSpan], processes: int) -> bool:
    names_seen = [s.name for s in spans]
    return (
        names.SPAN_STARTUP in names_seen
        and names_seen.count(names.SPAN_STARTUP_PROCESS) >= processes
        and names_seen.count(names.SPAN_STARTUP_STAGE_PREFIX + names.STARTUP_STAGE_UVICORN) >= processes
    )


def _tree_reported(directory: Path) -> bool:
    rows = {
        (_attrs(p)[names.ATTR_SERVER_NAME], _attrs(p)[names.ATTR_PROCESS_ROLE], _value(p))
        for p in _points(directory, LAUNCHER).get(names.METRIC_TREE_PROCESSES, [])
    }
    return {("model", "main", 1.0), ("model", "worker", 2.0), ("resources", "main", 1.0)} <= rows


def test_a_launched_fleet_is_one_startup_trace_with_every_process_in_it(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    config = _config(
        tmp_path,
        17201,
        f"  model: {{entrypoint: '{APPS}:DemoModelServer', server_type: responses_api_models,\n"
        "           port: 17202, num_workers: 2}\n"
        f"  resources: {{entrypoint: '{APPS}:DemoResourcesServer', server_type: resources_servers,\n"
        "               port: 17203}\n",
    )
    telemetry = tmp_path / "telemetry"
    process = _serve(config, tmp_path)
    try:
        receiver.wait_for(lambda s: _startup_spans_complete(s, processes=3), timeout_s=60)
        deadline = time.monotonic() + 30
        while not _tree_reported(telemetry) and time.monotonic() < deadline:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            time.sleep(0.2)
        assert _tree_reported(telemetry)
    finally:
        code = _stop(process)
    assert code == 0

    startup = [s for s in receiver.spans() if s.name.startswith(names.SPAN_STARTUP)]
    (root,) = [s for s in startup if s.name == names.SPAN_STARTUP]
    assert root.parent_span_id is None and root.service_name == LAUNCHER
    assert {s.trace_id for s in startup} == {root.trace_id}  # ONE trace
    by_id = {s.span_id: s for s in startup}

    stages = [s for s in startup if s.parent_span_id == root.span_id and s.name != names.SPAN_STARTUP_SERVER]
    assert sorted(s.attributes[names.ATTR_STARTUP_STAGE] for s in stages) == sorted(
        names.STARTUP_LAUNCHER_STAGES
    )
    assert all(root.start_ns <= s.start_ns <= s.end_ns <= root.end_ns for s in stages)
    load = next(
        s for s in stages if s.attributes[names.ATTR_STARTUP_STAGE] == names.STARTUP_STAGE_LOAD_CONFIG
    )
    assert load.end_ns - load.start_ns > 0  # recorded before telemetry was up, emitted with its real times

    servers = {
        s.attributes[names.ATTR_SERVER_NAME]: s for s in startup if s.name == names.SPAN_STARTUP_SERVER
    }
    assert set(servers) == {"head_server", "model", "resources"}
    assert all(s.parent_span_id == root.span_id and s.service_name == LAUNCHER for s in servers.values())
    assert all(s.status_code != STATUS_ERROR for s in servers.values())
    assert servers["model"].attributes[names.ATTR_SERVER_TYPE] == "responses_api_models"

    processes = [s for s in startup if s.name == names.SPAN_STARTUP_PROCESS]
    joined: dict[str, list[ReceivedSpan]] = defaultdict(list)
    for span in processes:
        parent = by_id[span.parent_span_id or ""]
        assert parent.name == names.SPAN_STARTUP_SERVER
        assert span.service_name == f"gym/{parent.attributes[names.ATTR_SERVER_NAME]}"  # its own process
        assert parent.start_ns <= span.start_ns
        joined[parent.attributes[names.ATTR_SERVER_NAME]].append(span)
    assert {name: len(spans) for name, spans in joined.items()} == {"model": 2, "resources": 1}  # 2 workers
    # A server is ready at its first healthy probe: after its process served (the first of its workers;
    # a second worker may come up later, and its own span says when).
    for name, spans in joined.items():
        assert min(span.end_ns for span in spans) <= servers[name].end_ns, name
    worker_ids = {span.resource[names.SERVICE_INSTANCE_ID] for span in joined["model"]}
    assert len(worker_ids) == 2
    for span in processes:
        kids = [s for s in startup if s.parent_span_id == span.span_id]
        assert [
            k.attributes[names.ATTR_STARTUP_STAGE] for k in sorted(kids, key=lambda k: k.start_ns)
        ] == list(names.STARTUP_PROCESS_STAGES)
        assert all(span.start_ns <= k.start_ns <= k.end_ns <= span.end_ns for k in kids)

    # The launcher's histogram: one point per server type that became ready.
    launcher = _points(telemetry, LAUNCHER)
    durations = {_attrs(p)[names.ATTR_SERVER_TYPE]: p for p in launcher[names.METRIC_SERVER_STARTUP_DURATION]}
    assert set(durations) == {"head_server", "responses_api_models", "resources_servers"}
    for point in durations.values():
        assert int(point["count"]) == 1 and 0 < float(point["sum"]) < 60
        assert [float(b) for b in point["explicitBounds"]] == list(names.SERVER_STARTUP_BUCKETS_S)

    # The launcher's process-tree gauges, with sane values for every launched process.
    rss = [
        p
        for p in launcher[names.METRIC_TREE_MEMORY_USAGE]
        if _attrs(p)[names.ATTR_MEMORY_TYPE] == names.MEMORY_TYPE_RSS
    ]
    assert {(_attrs(p)[names.ATTR_SERVER_NAME], _attrs(p)[names.ATTR_PROCESS_ROLE]) for p in rss} >= {
        ("head_server", "main"),
        ("model", "main"),
        ("model", "worker"),
        ("resources", "main"),
    }
    assert all(10 * 2**20 < _value(p) < 4 * 2**30 for p in rss), [_value(p) for p in rss]
    threads = launcher[names.METRIC_TREE_THREADS]
    assert all(_value(p) >= 1 for p in threads) and threads
    assert not any("gpu" in name for name in launcher)  # no nvidia-smi on this host: cleanly absent

    # Each server process reports its own gauges: both model workers and the resources server.
    model = _points(telemetry, "gym/model")
    model_pids = {p["pid"] for p in model[names.METRIC_PROCESS_MEMORY_USAGE]}
    assert len(model_pids) == 2
    for service in ("gym/model", "gym/resources"):
        own = _points(telemetry, service)
        assert all(_value(p) > 10 * 2**20 for p in own[names.METRIC_PROCESS_MEMORY_USAGE])
        assert all(_value(p) >= 3 for p in own[names.METRIC_PROCESS_FILE_DESCRIPTORS])
        assert own[names.METRIC_EVENT_LOOP_LAG]


def test_a_server_that_exits_at_startup_ends_its_span_with_the_exit_code(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    config = _config(
        tmp_path,
        17211,
        f"  model: {{entrypoint: '{APPS}:DemoModelServer', server_type: responses_api_models,\n"
        "           port: 17212}\n"
        f"  broken: {{entrypoint: '{APPS}:BrokenServer', server_type: resources_servers, port: 17213}}\n",
    )
    process = _serve(config, tmp_path)
    try:
        assert process.wait(timeout=90) == 1
    finally:
        _stop(process)
    spans = receiver.wait_for(lambda s: any(x.name == names.SPAN_STARTUP for x in s), timeout_s=15)
    (root,) = [s for s in spans if s.name == names.SPAN_STARTUP]
    assert root.status_code == STATUS_ERROR
    assert root.attributes[names.ATTR_ERROR_TYPE] == names.STARTUP_ERROR_LAUNCH_FAILED
    servers = {s.attributes[names.ATTR_SERVER_NAME]: s for s in spans if s.name == names.SPAN_STARTUP_SERVER}
    broken = servers["broken"]
    assert broken.trace_id == root.trace_id and broken.parent_span_id == root.span_id
    assert broken.status_code == STATUS_ERROR
    assert broken.attributes[names.ATTR_ERROR_TYPE] == names.STARTUP_ERROR_EXITED
    assert broken.attributes[names.ATTR_PROCESS_EXIT_CODE] == 1
    last_line = broken.attributes[names.ATTR_STARTUP_LAST_LOG_LINE]
    assert "model weights not found" in last_line, last_line
    assert (
        "exited with code 1" in broken.status_message and "model weights not found" in broken.status_message
    )
    # The healthy server became ready first (no error) or was cut short by the launch failing: never
    # blamed for the other's exit.
    model = servers["model"]
    assert model.status_code != STATUS_ERROR or model.attributes[names.ATTR_ERROR_TYPE] == (
        names.STARTUP_ERROR_LAUNCH_FAILED
    )
