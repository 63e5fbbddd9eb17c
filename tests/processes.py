"""Process helpers shared by the tests that kill launchers and check what is left: read from /proc, so
they see exactly what the kernel sees (zombies count as dead; every thread's children count)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path


def descendants(pid: int) -> set[int]:
    """Every live descendant of ``pid``, from /proc/<pid>/task/*/children."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        current = todo.pop()
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                children = {int(c) for c in (task / "children").read_text().split()}
            except OSError:
                continue
            todo += list(children - found)
            found |= children
    return found


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_until(condition: Callable[[], object], timeout: float, what: str) -> None:
    """Poll ``condition`` every 0.1 s; fail naming ``what`` if it is not true within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
