"""The harness writes OUT/report.html at the end of every run and prints its path; --no-report skips it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PORT_BASE = 32540


def _run(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "gym_obs.cli",
            "harness",
            "run",
            "--out",
            str(out),
            "--rollouts",
            "20",
            "--port-base",
            str(PORT_BASE),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=110,
    )


def test_every_run_writes_its_report_and_prints_the_path(tmp_path: Path) -> None:
    result = _run(tmp_path / "out")
    assert result.returncode == 0, result.stderr[-2000:]
    report = (tmp_path / "out" / "latest").resolve() / "report.html"  # the run's own folder
    assert f"report: {report}" in result.stdout
    page = report.read_text()
    assert page.startswith("<!DOCTYPE html>") and '<section id="summary">' in page


def test_no_report_skips_it(tmp_path: Path) -> None:
    result = _run(tmp_path / "out", "--no-report")
    assert result.returncode == 0, result.stderr[-2000:]
    assert not (tmp_path / "out" / "latest" / "report.html").exists()
    assert "report:" not in result.stdout
