"""The running loop and task, read in C.

``asyncio.current_task()`` is a Python function before Python 3.12: it asks for the running loop (whose
C lookup makes a ``getpid`` system call each time, to notice a fork), then the loop's entry in the
running-task table. Here the table's own ``get`` is used (``running_task(loop)``); from 3.12 on
``asyncio.current_task`` is C and is used as it is. Callers that already know the loop skip the loop
lookup.
"""

from __future__ import annotations

import _asyncio
import asyncio
from collections.abc import Callable
from typing import Any, Final

__all__ = ["running_loop", "running_task"]

running_loop: Final[Callable[[], asyncio.AbstractEventLoop]] = asyncio.get_running_loop


def _running_task_reader() -> Callable[[asyncio.AbstractEventLoop], asyncio.Task[Any] | None]:
    """``asyncio.current_task`` where it is C, else the C running-task table's ``get``."""
    in_c = getattr(_asyncio, "current_task", None)
    if in_c is not None:
        return in_c  # type: ignore[no-any-return]
    table: dict[asyncio.AbstractEventLoop, asyncio.Task[Any]] = getattr(_asyncio, "_current_tasks")  # noqa: B009
    return table.get


running_task: Final = _running_task_reader()
"""``running_task(loop)``: the task running on ``loop`` (``asyncio.current_task(loop)``), or ``None``."""
