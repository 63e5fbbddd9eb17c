"""Each ``gym-obs harness run`` writes its own folder ``OUT/<run-id>/``; ``OUT/latest`` points at the newest,
and ``gym-obs report`` / ``gym-obs explain`` given ``OUT`` read that newest run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

PORT_BASE = 29670


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_") and k != "GYM_OBS_RUN_ID"}
    return subprocess.run(
        [sys.executable, "-m", "gym_obs.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=cwd,
    )


def _harness(cwd: Path, *extra: str) -> dict[str, object]:
    done = _cli(
        "harness", "run", "--rollouts", "3", "--port-base", str(PORT_BASE), "--no-report", *extra, cwd=cwd
    )
    assert done.returncode == 0, done.stderr[-3000:]
    latest = cwd / "harness-out" / "latest"
    summary: dict[str, object] = json.loads((latest / "summary.json").read_text())
    return summary


def test_each_run_has_its_own_folder_and_latest_points_at_the_newest(tmp_path: Path) -> None:
    first = _harness(tmp_path)  # the default --out: harness-out in the working directory
    second = _harness(tmp_path)
    parent = tmp_path / "harness-out"
    assert first["run_id"] != second["run_id"]
    runs = sorted(p.name for p in parent.iterdir() if p.is_dir() and not p.is_symlink())
    assert runs == sorted([str(first["run_id"]), str(second["run_id"])])
    latest = parent / "latest"
    assert latest.is_symlink() and os.readlink(latest) == second["run_id"]
    assert second["out_dir"] == str(parent / str(second["run_id"]))
    for summary in (first, second):  # nothing of one run in the other's folder
        folder = parent / str(summary["run_id"])
        rows = (folder / "rollouts.jsonl").read_text().splitlines()
        assert len(rows) == 3 and all(
            json.loads(r)["rollout_id"].startswith(str(summary["run_id"])) for r in rows
        )
        logs = (folder / "logs" / "harness.log").read_text()
        other = second if summary is first else first
        assert str(other["run_id"]) not in logs

    report = _cli("report", cwd=tmp_path)  # default folder: harness-out, i.e. its latest run
    assert report.returncode == 0, report.stderr
    assert (tmp_path / report.stdout.strip()).resolve() == (
        parent / str(second["run_id"]) / "report.html"
    ).resolve()
    row = json.loads((latest / "rollouts.jsonl").read_text().splitlines()[0])
    explained = _cli("explain", row["rollout_id"], "--json", cwd=tmp_path)
    assert explained.returncode == 0, explained.stderr
    assert json.loads(explained.stdout)["rollout_id"] == row["rollout_id"]


def test_a_reused_run_id_gets_a_new_folder(tmp_path: Path) -> None:
    env_run = {"GYM_OBS_RUN_ID": "fixed-id"}
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-m", "gym_obs.cli", "harness", "run", "--rollouts", "2", "--no-report",
             "--port-base", str(PORT_BASE), "--out", str(tmp_path / "runs")],
            capture_output=True, text=True, timeout=120, env={**os.environ, **env_run},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["fixed-id", "fixed-id-2", "latest"]
    assert os.readlink(tmp_path / "runs" / "latest") == "fixed-id-2"
    assert len((tmp_path / "runs" / "fixed-id" / "rollouts.jsonl").read_text().splitlines()) == 2


def test_the_drivers_peak_memory_is_its_own_not_its_parents(tmp_path: Path) -> None:
    # A parent that touched 600 MB, then exec'd the harness: Linux keeps getrusage's ru_maxrss across fork and
    # exec, so a driver reading it would report the parent's 600 MB as its own peak.
    parent = (
        "import os, sys\n"
        "ballast = bytearray(600 * 1024 * 1024)\n"
        "for i in range(0, len(ballast), 4096): ballast[i] = 1\n"
        "os.execv(sys.executable, [sys.executable, '-m', 'gym_obs.cli', *sys.argv[1:]])\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_") and k != "GYM_OBS_RUN_ID"}
    done = subprocess.run(
        [sys.executable, "-c", parent, "harness", "run", "--rollouts", "2", "--no-report", "--no-telemetry",
         "--port-base", str(PORT_BASE), "--out", str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "runs" / "latest" / "summary.json").read_text())
    driver = summary["processes"]["harness"]
    assert driver["peak_rss_mb"] is not None and 0 < driver["peak_rss_mb"] < 300, driver
