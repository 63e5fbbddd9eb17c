"""gym_obs's version, in a module of its own so every layer can read it without importing the top package.

``gym_obs/__init__`` names client and server objects; a lower layer that imported it for the version (the
telemetry resource's ``service.version``) would point an arrow up the layers and close an import cycle.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    __version__ = version("gym-obs")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0"
