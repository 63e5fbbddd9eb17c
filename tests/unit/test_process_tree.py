"""Process-tree gauges on a real tree of processes, exported by the real Prometheus reader; nvidia-smi's
compute-apps parsing on recorded output; GPU cleanly absent without nvidia-smi; nothing when telemetry
is off."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from gym_obs import dashboards
from gym_obs.dashboards import prometheus_label
from gym_obs.server.startup import StartupTrace
from gym_obs.telemetry import names, process_tree
from gym_obs.telemetry.process_tree import ProcessTreeGauges, TreeRoot, start_process_tree_gauges
from gym_obs.telemetry.testing import Capture

# A "server" with two workers (argv as multiprocessing spawns them), one with a subprocess of its own, and a
# helper process that is a direct child but not a worker.
_TREE = textwrap.dedent(
    """
    import subprocess, sys, time
    worker = [sys.executable, "-c", "import time; time.sleep(60)", "--multiprocessing-fork"]
    nested = [sys.executable, "-c", "import subprocess, sys, time; "
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)",
              "--multiprocessing-fork"]
    helper = [sys.executable, "-c", "import time; time.sleep(60)"]  # like multiprocessing's resource tracker
    kids = [subprocess.Popen(worker), subprocess.Popen(nested), subprocess.Popen(helper)]
    print("up", flush=True)
    time.sleep(60)
    """
)

# Recorded from `nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits` on a
# two-GPU host (one process on each GPU, one on both), with a MIG line that reports no memory.
_COMPUTE_APPS = "4123, 15321\n4123, 2048\n  4188 , 512\n4190, [N/A]\nNo running processes found\n"

_SERVER = prometheus_label(names.ATTR_SERVER_NAME)
_ROLE = prometheus_label(names.ATTR_PROCESS_ROLE)


@pytest.fixture
def tree() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", _TREE], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        deadline = time.monotonic() + 20
        while len(_descendants(proc.pid)) < 4 and time.monotonic() < deadline:  # 2 workers, nested, helper
            time.sleep(0.05)
        assert len(_descendants(proc.pid)) == 4
        yield proc
    finally:
        os.killpg(proc.pid, 9)
        proc.wait(10)


def _descendants(pid: int) -> set[int]:
    parents = process_tree._procfs.parent_pids()
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _export(provider: MeterProvider, registry: CollectorRegistry) -> list[Sample]:
    text = generate_latest(registry).decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def _by_role(samples: list[Sample], spec: dashboards.MetricSpec, **labels: str) -> dict[str, float]:
    return {
        s.labels[_ROLE]: s.value
        for s in samples
        if s.name == spec.series() and all(s.labels.get(k) == v for k, v in labels.items())
    }


def test_a_real_tree_is_summed_by_server_and_role(tree: subprocess.Popen[bytes]) -> None:
    registry = CollectorRegistry()
    provider = MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)])
    try:
        gauges = ProcessTreeGauges(provider.get_meter(names.INSTRUMENTATION_SCOPE), gpu=False)
        stop = gauges.add(lambda: [TreeRoot("agent", tree.pid, workers=True)])
        _export(provider, registry)  # first sight of each pid: the CPU window starts here
        time.sleep(process_tree._SNAPSHOT_S + 0.1)
        samples = _export(provider, registry)
        tree_samples = [s for s in samples if s.name.startswith("gym_server_process_tree")]
        assert {s.labels[_SERVER] for s in tree_samples} == {"agent"}
        assert _by_role(samples, dashboards.TREE_PROCESSES) == {
            names.PROCESS_ROLE_MAIN: 1,
            names.PROCESS_ROLE_WORKER: 2,
            names.PROCESS_ROLE_CHILD: 2,  # the worker's subprocess and the helper
        }
        mem_type = prometheus_label(names.ATTR_MEMORY_TYPE)
        rss = _by_role(samples, dashboards.TREE_MEMORY_USAGE, **{mem_type: names.MEMORY_TYPE_RSS})
        pss = _by_role(samples, dashboards.TREE_MEMORY_USAGE, **{mem_type: names.MEMORY_TYPE_PSS})
        assert all(4 * 2**20 < value < 2**31 for value in rss.values()), rss  # a Python process: MBs, not GBs
        assert rss[names.PROCESS_ROLE_WORKER] > rss[names.PROCESS_ROLE_MAIN]  # two processes vs one
        assert all(0 < pss[role] <= rss[role] for role in rss), (pss, rss)
        threads = _by_role(samples, dashboards.TREE_THREADS)
        assert threads[names.PROCESS_ROLE_WORKER] >= 2 and threads[names.PROCESS_ROLE_MAIN] >= 1
        fds = _by_role(samples, dashboards.TREE_FILE_DESCRIPTORS)
        assert all(value >= 3 for value in fds.values()), fds  # stdin, stdout, stderr at least
        mode = prometheus_label(names.ATTR_CPU_MODE)
        cpu = _by_role(samples, dashboards.TREE_CPU_UTILIZATION, **{mode: names.CPU_MODE_USER})
        assert set(cpu) == set(names.PROCESS_ROLES) and all(0 <= v <= 1 for v in cpu.values()), cpu
        assert all(not s.name.startswith("gym_server_process_tree_gpu") for s in samples)  # gpu=False
        stop()
        time.sleep(process_tree._SNAPSHOT_S + 0.1)
        after = _export(provider, registry)
        assert _by_role(after, dashboards.TREE_PROCESSES) == {}  # a stopped source reports nothing
    finally:
        provider.shutdown()


def test_a_process_that_is_gone_is_no_point() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(10)
    provider = MeterProvider(metric_readers=[])
    try:
        gauges = ProcessTreeGauges(provider.get_meter("t"), gpu=False)
        gauges.add(lambda: [TreeRoot("gone", proc.pid)])
        assert gauges.totals() == {}
    finally:
        provider.shutdown()


def test_compute_apps_parsing_on_recorded_output() -> None:
    assert process_tree._parse_compute_apps(_COMPUTE_APPS) == [
        (4123, 15321 * 2**20),
        (4123, 2048 * 2**20),
        (4188, 512 * 2**20),
    ]
    assert process_tree._parse_compute_apps("") == []
    assert process_tree._parse_compute_apps("-1, 5\n12, -5\nabc, 1\n" + "7, 1\n" * 5000)[:1] == [(7, 2**20)]
    assert len(process_tree._parse_compute_apps("7, 1\n" * 5000)) == process_tree._MAX_APPS


def _stand_in(tmp_path: Path, body: str) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "nvidia-smi"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return bindir


def test_gpu_memory_per_tree_from_nvidia_smi(
    tree: subprocess.Popen[bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = min(child for child, parent in process_tree._procfs.parent_pids().items() if parent == tree.pid)
    assert "--multiprocessing-fork" in (process_tree._procfs.command_line(f"/proc/{worker}") or ())
    lines = f"{tree.pid}, 100\\n{worker}, 50\\n{worker}, 25\\n999999999, 7\\n"
    bindir = _stand_in(tmp_path, f"printf '{lines}'\n")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    registry = CollectorRegistry()
    provider = MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)])
    try:
        gauges = ProcessTreeGauges(provider.get_meter(names.INSTRUMENTATION_SCOPE), gpu=True)
        gauges.add(lambda: [TreeRoot("model", tree.pid, workers=True)])
        deadline = time.monotonic() + 10
        while (gauges.gpu is None or not gauges.gpu.samples()) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(process_tree._SNAPSHOT_S + 0.1)
        gpu = _by_role(_export(provider, registry), dashboards.TREE_GPU_MEMORY_USAGE)
        assert gpu[names.PROCESS_ROLE_MAIN] == 100 * 2**20
        assert gpu[names.PROCESS_ROLE_WORKER] == 75 * 2**20  # summed over the worker's two GPUs
    finally:
        provider.shutdown()


def test_without_nvidia_smi_there_is_no_gpu_instrument(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The absent path for real: a PATH where no nvidia-smi exists (no stand-in, no mock)."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    registry = CollectorRegistry()
    provider = MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)])
    try:
        gauges = ProcessTreeGauges(provider.get_meter(names.INSTRUMENTATION_SCOPE), gpu=True)
        assert gauges.gpu is None
        gauges.add(lambda: [TreeRoot("self", os.getpid())])
        samples = _export(provider, registry)
        assert _by_role(samples, dashboards.TREE_PROCESSES) == {names.PROCESS_ROLE_MAIN: 1}
        assert not any("gpu" in s.name for s in samples)
    finally:
        provider.shutdown()


def test_telemetry_off_creates_nothing() -> None:
    assert start_process_tree_gauges(lambda: [TreeRoot("x", os.getpid())]) is None


def test_startup_histogram_as_prometheus_names_it(telemetry: Capture) -> None:
    registry = CollectorRegistry()
    provider = MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)])
    try:
        from gym_obs.server import startup

        startup._startup_histogram(provider.get_meter("t")).record(1.5, {names.ATTR_SERVER_TYPE: "model"})
        exported = {s.name for s in _export(provider, registry)}
        for suffix in ("_bucket", "_sum", "_count"):
            assert dashboards.SERVER_STARTUP_DURATION.series(suffix) in exported
    finally:
        provider.shutdown()
    trace = StartupTrace()
    trace.activate()
    trace.server_spawning("m", "model")
    trace.server_ready("m")
    (point,) = telemetry.metric_points(names.METRIC_SERVER_STARTUP_DURATION)
    assert point.attributes == {names.ATTR_SERVER_TYPE: "model"} and point.count == 1
    assert point.explicit_bounds == names.SERVER_STARTUP_BUCKETS_S
