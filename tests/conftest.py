"""Shared pytest fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gym_obs.telemetry.testing import Capture, capture_telemetry


@pytest.fixture
def telemetry() -> Iterator[Capture]:
    """Telemetry on for the test, recorded in memory (real SDK providers, in-memory exporter and reader)."""
    with capture_telemetry() as capture:
        yield capture
