"""Lets a test capture own process telemetry while it runs.

While a :func:`gym_obs.telemetry.testing.capture_telemetry` block is active, ``setup_telemetry`` (called by a
server started inside the test) must neither install exporters nor switch ``STATE`` off under the test.
"""

from __future__ import annotations

import threading
from typing import Final

_LOCK: Final = threading.Lock()
_depth = 0
TEST_PROVIDER_IDS: Final[set[int]] = set()
"""ids of providers the test capture created: ``setup_telemetry`` outside a capture does not adopt them."""


def capture_active() -> bool:
    """True while at least one test capture is active."""
    return _depth > 0


def enter_capture() -> None:
    global _depth
    with _LOCK:
        _depth += 1


def exit_capture() -> None:
    global _depth
    with _LOCK:
        _depth = max(_depth - 1, 0)
