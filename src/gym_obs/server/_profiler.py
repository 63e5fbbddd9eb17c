"""ServerProfiler: a server's CPU profile for its whole lifetime, with pyinstrument (extra ``profiling``).

pyinstrument samples the thread it starts on; a server's requests run on its event-loop thread, so the
profiler starts in the app's lifespan and stays on for the process lifetime (each uvicorn worker profiles
itself and writes its own report). Samples are timed with the thread's CPU clock where available, so time
spent waiting in the event loop's ``select`` costs nothing and the report shows where CPU goes, not where
the server idles. A lifetime profile must not grow without bound: every ``compact_every_s`` the samples are
folded into one record per distinct stack, which renders the same report. Reports (text and HTML) are
written on shutdown and on ``GET /stats``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from gym_obs.server.uvicorn import ServerStartupError
from gym_obs.telemetry.logging import get_logger

if TYPE_CHECKING:
    from fastapi import FastAPI
    from pyinstrument import Profiler
    from pyinstrument.session import Session

__all__ = ["DEFAULT_RESULTS_DIRPATH", "ProfileReport", "ServerProfiler", "profiler_for"]

DEFAULT_RESULTS_DIRPATH: Final = "profiling_results"
STATS_ROUTE: Final = "/stats"
_INTERVAL_S: Final = 0.001
_COMPACT_EVERY_S: Final = 60.0

_log = get_logger("gym_obs.server.profiling")


@dataclass(frozen=True)
class ProfileReport:
    """Where a report was written and what it covers."""

    text_path: Path
    html_path: Path
    samples: int
    cpu_s: float
    duration_s: float

    def as_json(self) -> dict[str, Any]:
        return {
            "text_path": str(self.text_path),
            "html_path": str(self.html_path),
            "samples": self.samples,
            "cpu_s": round(self.cpu_s, 6),
            "duration_s": round(self.duration_s, 6),
        }


def _outermost_frame() -> Any:
    frame = sys._getframe(1)
    while frame.f_back is not None:
        frame = frame.f_back
    return frame


def _compact(session: Session) -> Session:
    """One frame record per distinct stack (times summed): same aggregate report, bounded memory."""
    from pyinstrument.session import Session

    totals: dict[tuple[str, ...], float] = {}
    for stack, seconds in session.frame_records:
        key = tuple(stack)
        totals[key] = totals.get(key, 0.0) + seconds
    return Session(
        frame_records=[(list(stack), seconds) for stack, seconds in totals.items()],
        start_time=session.start_time,
        duration=session.duration,
        min_interval=session.min_interval,
        max_interval=session.max_interval,
        sample_count=session.sample_count,
        start_call_stack=session.start_call_stack,
        target_description=session.target_description,
        cpu_time=session.cpu_time,
        sys_path=session.sys_path,
        sys_prefixes=session.sys_prefixes,
    )


class ServerProfiler:
    """Profiles the event-loop thread of one server process from lifespan start to shutdown.

    ``attach(app)`` wires it into a FastAPI app (lifespan and ``GET /stats``); ``start``/``rotate``/``stop``
    must run on the profiled thread, rendering does not.
    """

    def __init__(
        self,
        server_name: str,
        results_dir: str | os.PathLike[str],
        *,
        interval_s: float = _INTERVAL_S,
        compact_every_s: float = _COMPACT_EVERY_S,
    ) -> None:
        self.server_name = server_name
        self.results_dir = Path(results_dir)
        self.interval_s = interval_s
        self.compact_every_s = compact_every_s
        self._profiler: Profiler | None = None
        self._session: Session | None = None
        self._lock = threading.Lock()
        self._compactor: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._profiler is not None and self._profiler.is_running

    def report_paths(self) -> tuple[Path, Path]:
        stem = f"{self.server_name}-{os.getpid()}"
        return self.results_dir / f"{stem}.txt", self.results_dir / f"{stem}.html"

    # -- sampling (on the profiled thread) -----------------------------------------------------------------

    def start(self) -> None:
        from pyinstrument import Profiler
        from pyinstrument.stack_sampler import get_stack_sampler

        if self.running:
            return
        sampler = get_stack_sampler()
        if getattr(sampler, "timer_func", None) is None and hasattr(time, "thread_time"):
            sampler.timer_func = time.thread_time  # CPU time of this thread: idle waits cost nothing
        # A fresh Profiler per segment: a restarted one would re-combine everything it saw before.
        self._profiler = Profiler(interval=self.interval_s, async_mode="disabled")
        self._profiler.start(
            caller_frame=_outermost_frame(), target_description=f"gym server {self.server_name}"
        )

    def rotate(self) -> Session | None:
        """Take the samples so far (profiling continues); returns them uncompacted."""
        session = self.stop()
        if session is not None:
            self.start()
        return session

    def stop(self) -> Session | None:
        profiler, self._profiler = self._profiler, None
        if profiler is None or not profiler.is_running:
            return None
        return profiler.stop()

    # -- aggregation and reports (any thread) --------------------------------------------------------------

    def _absorb(self, session: Session | None) -> Session | None:
        from pyinstrument.session import Session

        with self._lock:
            if session is not None:
                merged = session if self._session is None else Session.combine(self._session, session)
                self._session = _compact(merged)
            return self._session

    def write_report(self, session: Session | None = None) -> ProfileReport | None:
        """Fold ``session`` into the lifetime profile and write the text and HTML reports."""
        from pyinstrument.renderers import ConsoleRenderer, HTMLRenderer

        total = self._absorb(session)
        if total is None:
            return None
        text_path, html_path = self.report_paths()
        self.results_dir.mkdir(parents=True, exist_ok=True)
        text = ConsoleRenderer(unicode=True, color=False, show_all=False).render(total)
        _atomic_write(text_path, text)
        _atomic_write(html_path, HTMLRenderer().render(total))
        return ProfileReport(text_path, html_path, total.sample_count, total.cpu_time, total.duration)

    async def write_report_async(self) -> ProfileReport | None:
        """Rotate on the loop thread, render on a worker thread (the loop keeps serving meanwhile)."""
        session = self.rotate()
        return await asyncio.to_thread(self.write_report, session)

    async def _compact_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.compact_every_s)
            session = self.rotate()
            await asyncio.to_thread(self._absorb, session)

    # -- wiring into an app --------------------------------------------------------------------------------

    def attach(self, app: FastAPI) -> None:
        """Profile for the app's lifespan; ``GET /stats`` writes the report and answers where it is."""
        from fastapi.responses import JSONResponse

        inner = app.router.lifespan_context

        @contextlib.asynccontextmanager
        async def lifespan(lifespan_app: Any) -> AsyncIterator[Any]:
            self.start()
            self._compactor = asyncio.get_running_loop().create_task(self._compact_periodically())
            _log.info("profiling", results_dir=str(self.results_dir.resolve()))
            try:
                async with inner(lifespan_app) as state:
                    yield state
            finally:
                if self._compactor is not None:
                    self._compactor.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await self._compactor
                report = self.write_report(self.stop())
                if report is not None:
                    _log.info("profile written", path=str(report.text_path), html=str(report.html_path))

        app.router.lifespan_context = lifespan
        if any(getattr(route, "path", None) == STATS_ROUTE for route in app.router.routes):
            _log.warning("profiling: the app has its own GET /stats; reports are written on shutdown only")
            return

        async def stats() -> JSONResponse:
            report = await self.write_report_async()
            body: dict[str, Any] = {"server_name": self.server_name, "pid": os.getpid()}
            body["profile"] = report.as_json() if report is not None else None
            return JSONResponse(body)

        app.add_api_route(STATS_ROUTE, stats, methods=["GET"], include_in_schema=False)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def profiler_for(server_name: str, server_config: Any, *, where: str = "server") -> ServerProfiler | None:
    """The profiler a server's config asks for (``profiling_enabled``, ``profiling_results_dirpath``).

    Raises :class:`ServerStartupError` when profiling is on but pyinstrument is not installed.
    """
    if not getattr(server_config, "profiling_enabled", False):
        return None
    try:
        import pyinstrument  # noqa: F401
    except ImportError:
        raise ServerStartupError(
            f"{where}.profiling_enabled: profiling needs pyinstrument: pip install 'gym-obs[profiling]'"
        ) from None
    results_dir = getattr(server_config, "profiling_results_dirpath", None) or DEFAULT_RESULTS_DIRPATH
    return ServerProfiler(server_name, results_dir)
