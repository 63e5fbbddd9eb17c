"""Build, render and write the dashboard JSON; the check that the committed files are what the code builds.

Building needs the ``dashboards`` extra (grafana-foundation-sdk), so the boards are imported only when one
is built: ``gym-obs --help`` and the name mapping never load the SDK.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

__all__ = ["DEFAULT_OUT_DIR", "build_dashboards", "render_dashboard", "stale_dashboards", "write_dashboards"]

DEFAULT_OUT_DIR: Final = Path("dashboards")


def build_dashboards() -> dict[str, dict[str, Any]]:
    """Every dashboard as a JSON-ready dict, keyed by its file name (``gym-rollouts.json``, ...)."""
    from gym_obs.dashboards import _boards  # the SDK is an optional extra: import only when building

    return _boards.build_all()


def render_dashboard(model: dict[str, Any]) -> str:
    """Deterministic JSON text: sorted keys, two-space indent, trailing newline (diff-friendly)."""
    return json.dumps(model, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def stale_dashboards(out_dir: Path = DEFAULT_OUT_DIR) -> list[Path]:
    """Dashboard files in ``out_dir`` that are missing or differ from what the code builds."""
    stale: list[Path] = []
    for file_name, model in sorted(build_dashboards().items()):
        path = out_dir / file_name
        if not path.is_file() or path.read_text(encoding="utf-8") != render_dashboard(model):
            stale.append(path)
    return stale


def write_dashboards(out_dir: Path = DEFAULT_OUT_DIR) -> list[Path]:
    """Write every dashboard to ``out_dir`` and return the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for file_name, model in sorted(build_dashboards().items()):
        path = out_dir / file_name
        path.write_text(render_dashboard(model), encoding="utf-8")
        written.append(path)
    return written
