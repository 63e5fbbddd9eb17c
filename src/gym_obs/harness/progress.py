"""The live progress bar: done, failed, rate and rollout latency p50/p99 while the run goes on."""

from __future__ import annotations

import time
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from gym_obs.harness.stats import LatencyWindow

__all__ = ["RunProgress"]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}ms"


class RunProgress:
    """A rich progress bar when the console is a terminal; silent otherwise (rows and summary remain)."""

    def __init__(self, total: int, console: Console, *, enabled: bool | None = None) -> None:
        self.total = total
        self.done = 0
        self.failed = 0
        self.latencies = LatencyWindow()
        self._started = time.perf_counter()
        self._last_refresh = 0.0
        live = console.is_terminal if enabled is None else enabled
        self._progress = Progress(
            TextColumn("[bold]rollouts"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("[red]{task.fields[failed]} failed"),
            TextColumn("{task.fields[rate]}/s"),
            TextColumn("p50 {task.fields[p50]} p99 {task.fields[p99]}"),
            TimeElapsedColumn(),
            console=console,
            disable=not live,
            transient=False,
        )
        self._task: TaskID = self._progress.add_task(
            "rollouts", total=total, failed=0, rate="0.0", p50="-", p99="-"
        )

    def __enter__(self) -> RunProgress:
        self._progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._refresh(force=True)
        self._progress.stop()

    @property
    def rate(self) -> float:
        elapsed = time.perf_counter() - self._started
        return self.done / elapsed if elapsed > 0 else 0.0

    def status(self) -> str:
        """One plain line for the run's log: how many rollouts finished (their rows are on disk)."""
        return (
            f"rollouts done: {self.done}/{self.total} ({self.failed} failed), {self.rate:.1f}/s, "
            f"p50 {_ms(self.latencies.quantile(0.5))} p99 {_ms(self.latencies.quantile(0.99))}"
        )

    def record(self, duration_s: float, *, failed: bool) -> None:
        self.done += 1
        self.failed += int(failed)
        self.latencies.add(duration_s)
        self._refresh()

    def _refresh(self, *, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now - self._last_refresh < 0.25 and self.done < self.total:
            self._progress.update(self._task, completed=self.done)
            return
        self._last_refresh = now
        self._progress.update(
            self._task,
            completed=self.done,
            failed=self.failed,
            rate=f"{self.rate:.1f}",
            p50=_ms(self.latencies.quantile(0.5)),
            p99=_ms(self.latencies.quantile(0.99)),
        )
