"""The fan-out load and fault harness: a demo rollout system on the runtime, driven hard, faults injected.

``gym-obs harness run`` is the command; :func:`run_harness` with :class:`HarnessOptions` is the same from
Python. Names are imported lazily so that building the ``gym-obs`` parser stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gym_obs.harness.faults import CANARY_SECRET, FaultPlan, FaultPlanError, FaultRule, load_fault_plan
    from gym_obs.harness.run import run_harness
    from gym_obs.harness.stack import HarnessError, HarnessOptions

__all__ = [
    "CANARY_SECRET",
    "FaultPlan",
    "FaultPlanError",
    "FaultRule",
    "HarnessError",
    "HarnessOptions",
    "load_fault_plan",
    "run_harness",
]

_HOMES = {
    "CANARY_SECRET": "faults",
    "FaultPlan": "faults",
    "FaultPlanError": "faults",
    "FaultRule": "faults",
    "load_fault_plan": "faults",
    "HarnessError": "stack",
    "HarnessOptions": "stack",
    "run_harness": "run",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'gym_obs.harness' has no attribute {name!r}")
    return getattr(importlib.import_module(f"gym_obs.harness.{home}"), name)
