"""GPU gauges from ``nvidia-smi``: parsed, cached, and never blocking an export (stand-in executables)."""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from gym_obs.telemetry import names, resources

_CSV = "0, 35, 1024\n1, [N/A], 2048\n"


def _stand_in(tmp_path: Path, body: str) -> Path:
    """A directory holding an executable called nvidia-smi that runs ``body`` (a shell script)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "nvidia-smi"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return bindir


def _gpu_points(reader: InMemoryMetricReader) -> dict[str, dict[str, float]]:
    found: dict[str, dict[str, float]] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name in (names.METRIC_GPU_UTILIZATION, names.METRIC_GPU_MEMORY_USAGE):
                    found[metric.name] = {
                        str((p.attributes or {})[names.ATTR_HW_ID]): p.value  # type: ignore[union-attr]
                        for p in metric.data.data_points
                    }
    return found


def test_parse_nvidia_smi() -> None:
    text = "0, 35, 1024\n1, [N/A], 2048\n2, 50, [Not Supported]\ngarbage line\n\n" + "9, 1, 1\n" * 100
    parsed = resources._parse_nvidia_smi(text)
    assert parsed[:3] == [
        ("gpu0", 0.35, 1024 * 1024 * 1024),
        ("gpu1", None, 2048 * 1024 * 1024),
        ("gpu2", 0.5, None),
    ]
    assert len(parsed) <= 64  # bounded however much the tool prints


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", []),
        ("x", []),
        ("-1, 5, 5", []),
        ("0,1", []),
        ("gpu0, 5, 5", []),
        ("0, -5, nan", [("gpu0", None, None)]),
        ("3, inf, 1", [("gpu3", None, 1024 * 1024)]),
    ],
)
def test_parse_rejects_junk(text: str, expected: list[tuple[str, float | None, int | None]]) -> None:
    assert resources._parse_nvidia_smi(text) == expected


def test_gpu_gauges_from_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = _stand_in(tmp_path, f"printf '{_CSV}'\n")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        gauges = resources._ProcessGauges(provider.get_meter("t"), gpu=True)
        assert gauges.gpu is not None
        deadline = time.monotonic() + 10
        points = _gpu_points(reader)
        while not points and time.monotonic() < deadline:  # the first refresh runs in its thread
            time.sleep(0.02)
            points = _gpu_points(reader)
        assert points[names.METRIC_GPU_UTILIZATION] == {"gpu0": 0.35}  # N/A is absent, not zero
        assert points[names.METRIC_GPU_MEMORY_USAGE] == {
            "gpu0": 1024 * 1024 * 1024,
            "gpu1": 2048 * 1024 * 1024,
        }
    finally:
        provider.shutdown()


def test_hung_nvidia_smi_never_blocks_an_export(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started = tmp_path / "started"
    bindir = _stand_in(tmp_path, f"touch '{started}'\nexec sleep 30\n")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        gauges = resources._ProcessGauges(provider.get_meter("t"), gpu=True)
        while not started.exists():
            time.sleep(0.02)
        # nvidia-smi is still running: the export goes ahead with the other gauges and no GPU points
        done = threading.Event()
        names_seen: list[str] = []

        def export() -> None:
            data = reader.get_metrics_data()
            for rm in data.resource_metrics if data else []:
                for sm in rm.scope_metrics:
                    names_seen.extend(m.name for m in sm.metrics)
            done.set()

        threading.Thread(target=export, daemon=True).start()
        assert done.wait(4.0), "an export waited for nvidia-smi"  # nvidia-smi itself runs 5 s, then times out
        assert names.METRIC_PROCESS_MEMORY_USAGE in names_seen
        assert names.METRIC_GPU_UTILIZATION not in names_seen
        assert gauges.gpu is not None and gauges.gpu._running
    finally:
        provider.shutdown()


def test_gpu_disabled_by_switch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = _stand_in(tmp_path, f"printf '{_CSV}'\n")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    try:
        assert resources._ProcessGauges(provider.get_meter("t"), gpu=False).gpu is None
    finally:
        provider.shutdown()
