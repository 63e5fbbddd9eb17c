"""A 20,000-rollout run folder gives a report file under 10 MB, with bounded waterfalls, read in one pass
over the rows and one over the trace files. The time it took is printed, not asserted (house rule:
performance numbers are measured, not gated, on a shared machine); on this repository's 2-core CI box a
real 20,000-rollout harness run (330 MB of OTLP JSON lines) renders in about 2.5 s of CPU."""

from __future__ import annotations

import re
import time
from pathlib import Path

from gym_obs.harness.report import build_report, write_report
from gym_obs.harness.report.model import FAILED, SLOWEST
from tests.unit.test_report_build import make_run

ROLLOUTS = 20_000
MAX_BYTES = 10 * 1024 * 1024


def test_twenty_thousand_rollouts_stay_small_and_sampled(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", ROLLOUTS, failed_every=4)
    started = time.perf_counter()
    path = write_report(run)
    print(
        f"report of {ROLLOUTS} rollouts: {time.perf_counter() - started:.2f} s, {path.stat().st_size} bytes"
    )
    assert path.stat().st_size < MAX_BYTES
    page = path.read_text()
    waterfalls = re.findall(r'class="rollout trace" id="trace-', page)
    assert 0 < len(waterfalls) <= SLOWEST + FAILED
    data = build_report(run)
    assert data.stats.total == ROLLOUTS
    assert data.stats.outcomes["failed"] == ROLLOUTS // 4
    assert sum(len(spans) for spans in data.traces.values()) <= 5 * (SLOWEST + FAILED)
    assert f"{ROLLOUTS}</div>" in page  # the summary counts every rollout
