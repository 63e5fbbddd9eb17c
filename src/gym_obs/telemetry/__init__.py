"""Telemetry core: names, set-up, spans, metrics, redaction, bounded bodies, propagation and logging.

Importing the package first repairs ``OTEL_*`` values that would make the OpenTelemetry SDK raise at import
time (see :mod:`gym_obs.telemetry._sdk_env`): a broken environment must never stop the program.
"""

from __future__ import annotations

from gym_obs.telemetry._sdk_env import repair_sdk_environment as _repair_sdk_environment

_repair_sdk_environment()
