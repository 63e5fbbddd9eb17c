"""Operations around a server process: open-file limit, shared-terminal output, CPU profiling.

A rollout server holds thousands of sockets (one per concurrent request, plus its own client pools), and
the default soft limit of 1024 open files is reached long before the CPU is busy: :func:`set_ulimit` raises
it at start-up. When several servers share a terminal, :func:`pump_output` prefixes every line with
``(<server name>) `` so interleaved logs stay readable. :class:`ServerProfiler` (optional extra
``profiling``) profiles a server's CPU for its lifetime.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Final

from gym_obs.client.pool import effective_limits
from gym_obs.config import GlobalAIOHTTPAsyncClientConfig, ServerInstanceConfig
from gym_obs.telemetry.logging import get_logger

__all__ = [
    "DEFAULT_NOFILE_TARGET",
    "LinePrefixer",
    "UlimitResult",
    "nofile_needed",
    "output_prefix",
    "pump_output",
    "set_ulimit",
]

DEFAULT_NOFILE_TARGET: Final = 65535
_MACOS_OPEN_MAX: Final = 10240  # setrlimit(RLIMIT_NOFILE) above OPEN_MAX fails on macOS even if hard allows
_MAX_LINE_BYTES: Final = 64 * 1024
_NOFILE_HEADROOM: Final = 256  # log files, pipes, the event loop's own descriptors, imported libraries

_log = get_logger("gym_obs.server.ops")


# --- open-file limit -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UlimitResult:
    """What :func:`set_ulimit` found and did. ``None`` limits mean "unknown" (no ``resource`` module);
    ``-1`` is unlimited (``RLIM_INFINITY``)."""

    before: int | None
    after: int | None
    hard: int | None
    target: int
    changed: bool
    reason: str
    needed: int | None = None  # what the config needs (:func:`nofile_needed`); None: the target

    @property
    def enough(self) -> bool:
        """The soft limit covers what the config needs (or unlimited); unknown counts as not enough."""
        need = self.target if self.needed is None else self.needed
        return self.after is not None and (self.after == -1 or self.after >= need)

    @property
    def ok(self) -> bool:
        """The soft limit is at least the target (or unlimited)."""
        return self.after is not None and (self.after == -1 or self.after >= self.target)


def _limit(value: int, infinity: int) -> int:
    return -1 if value == infinity else value


def nofile_needed(server: ServerInstanceConfig, client: GlobalAIOHTTPAsyncClientConfig, servers: int) -> int:
    """Open files one process of ``server`` may hold under its config: the listen backlog's connections,
    its client sockets (the intended concurrency when set, else every gym server at the per-host cap;
    never more than the data pool's limit) and the control pool, plus headroom for files and pipes."""
    limits = effective_limits(client, server.num_workers)
    intended = client.global_aiohttp_intended_concurrency
    data = -(-intended // limits.workers) if intended is not None else limits.data.host_cap * max(1, servers)
    if limits.data.limit > 0:
        data = min(data, limits.data.limit)
    return server.backlog + data + limits.control.limit + _NOFILE_HEADROOM


def set_ulimit(target_soft_limit: int = DEFAULT_NOFILE_TARGET, *, needed: int | None = None) -> UlimitResult:
    """Raise the open-file soft limit (``RLIMIT_NOFILE``) towards ``target_soft_limit``, never above the
    hard one.

    Never lowers a limit and never raises. A limit that stays below the target is a warning only when it
    also stays below ``needed`` (what the config needs, :func:`nofile_needed`; default: the target): a
    hard limit of 20000 is no problem for a server that holds a few thousand sockets. The result says why
    (hard limit too low, not permitted, no ``resource`` module on this platform).
    """
    need = target_soft_limit if needed is None else needed
    try:
        import resource
    except ImportError:
        reason = "the resource module is not available on this platform; open-file limit unchanged"
        _log.warning("cannot raise the open-file limit", reason=reason)
        return UlimitResult(None, None, None, target_soft_limit, False, reason, needed)

    infinity = resource.RLIM_INFINITY
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    before, hard_value = _limit(soft, infinity), _limit(hard, infinity)
    if soft == infinity or soft >= target_soft_limit:
        reason = f"soft limit {soft if soft != infinity else 'unlimited'} already meets {target_soft_limit}"
        return UlimitResult(before, before, hard_value, target_soft_limit, False, reason, needed)

    wanted = target_soft_limit if hard == infinity else min(target_soft_limit, hard)
    candidates = [wanted]
    if sys.platform == "darwin" and wanted > _MACOS_OPEN_MAX:
        candidates.append(_MACOS_OPEN_MAX)
    error: OSError | ValueError | None = None
    for candidate in candidates:
        if candidate <= soft:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (candidate, hard))
        except (OSError, ValueError) as exc:
            error = exc
            continue
        after = _limit(resource.getrlimit(resource.RLIMIT_NOFILE)[0], infinity)
        if candidate >= target_soft_limit:
            reason = f"raised the soft limit from {soft} to {after}"
            return UlimitResult(before, after, hard_value, target_soft_limit, True, reason, needed)
        reason = (
            f"raised the soft limit from {soft} to {after}, below the target {target_soft_limit}: "
            + (f"the hard limit is {hard}" if candidate == wanted else "the platform's OPEN_MAX caps it")
        )
        if after != -1 and after < need:
            _log.warning(
                "open-file limit below target",
                soft=after,
                hard=hard_value,
                target=target_soft_limit,
                needed=need,
            )
        return UlimitResult(before, after, hard_value, target_soft_limit, True, reason, needed)

    reason = (
        f"could not raise the soft limit {soft} towards {target_soft_limit} (hard {hard_value}): {error}"
        if error is not None
        else f"the hard limit {hard} does not allow more than the current soft limit {soft}"
    )
    if before < need:
        _log.warning("cannot raise the open-file limit", reason=reason, needed=need)
    return UlimitResult(before, before, hard_value, target_soft_limit, False, reason, needed)


# --- output of servers sharing a terminal ----------------------------------------------------------------


def output_prefix(server_name: str) -> bytes:
    """``(<server name>) `` as bytes, the prefix of each of a server's lines on a shared terminal."""
    return f"({server_name}) ".encode("utf-8", errors="replace")


class LinePrefixer:
    """Incrementally prefixes whole lines of a byte stream; a partial line waits for its end.

    ``feed()`` returns the prefixed complete lines seen so far; ``flush()`` returns the last partial line
    (prefixed, newline added). A line longer than 64 KiB is cut into prefixed pieces rather than buffered
    without bound.
    """

    def __init__(self, prefix: bytes) -> None:
        self.prefix = prefix
        self._pending = bytearray()

    def feed(self, data: bytes) -> bytes:
        self._pending += data
        out = bytearray()
        while True:
            end = self._pending.find(b"\n")
            if end == -1:
                if len(self._pending) < _MAX_LINE_BYTES:
                    break
                end = _MAX_LINE_BYTES - 1
                out += self.prefix + self._pending[: end + 1] + b"\n"
            else:
                out += self.prefix + self._pending[: end + 1]
            del self._pending[: end + 1]
        return bytes(out)

    def flush(self) -> bytes:
        if not self._pending:
            return b""
        out = self.prefix + bytes(self._pending) + b"\n"
        self._pending.clear()
        return out


def _write(sink: IO[bytes], data: bytes) -> bool:
    try:
        sink.write(data)
        sink.flush()
    except (OSError, ValueError):
        return False  # a closed terminal or log must not stop the pump: the child would block on its pipe
    return True


def _pump(source: IO[bytes], raw_sinks: list[IO[bytes]], prefixed: list[IO[bytes]], prefix: bytes) -> None:
    prefixer = LinePrefixer(prefix)
    try:
        while True:
            chunk = source.read1(_MAX_LINE_BYTES) if hasattr(source, "read1") else source.read(4096)
            if not chunk:
                break
            raw_sinks[:] = [sink for sink in raw_sinks if _write(sink, chunk)]
            lines = prefixer.feed(chunk)
            if lines:
                prefixed[:] = [sink for sink in prefixed if _write(sink, lines)]
        tail = prefixer.flush()
        if tail:
            for sink in prefixed:
                _write(sink, tail)
    except (OSError, ValueError):
        pass
    finally:
        with contextlib.suppress(OSError, ValueError):
            source.close()


def pump_output(
    source: IO[bytes],
    server_name: str,
    *,
    raw: Sequence[IO[bytes]] = (),
    prefixed: Sequence[IO[bytes]] = (),
) -> threading.Thread:
    """Copy a child's output pipe until EOF: unchanged to ``raw`` sinks (its log file), and with each line
    prefixed by ``(<server name>) `` to ``prefixed`` sinks (a terminal shared with other servers).

    Runs on a daemon thread (returned, started). A sink that fails is dropped; the pipe is always drained,
    so a child never blocks on a full pipe because nobody reads it.
    """
    thread = threading.Thread(
        target=_pump,
        args=(source, list(raw), list(prefixed), output_prefix(server_name)),
        name=f"gym-obs-output-{server_name}",
        daemon=True,
    )
    thread.start()
    return thread
