"""Dashboards as code: committed JSON == what the code builds, and the rules every panel follows."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from gym_obs import dashboards
from gym_obs.cli import main
from gym_obs.dashboards import GYM_METRICS, JOB_LABEL, PROMETHEUS_DATASOURCE_UID, prometheus_label
from gym_obs.telemetry import names
from tests.e2e.promql_check import metric_names, panel_queries

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "dashboards"

_BUILT = dashboards.build_dashboards()
_SERIES = {spec.series(suffix) for spec in GYM_METRICS for suffix in ("", "_bucket", "_sum", "_count")}
_ALLOWED_LABELS = {
    prometheus_label(value) for key, value in vars(names).items() if key.startswith("ATTR_")
} | {JOB_LABEL, "le", "__name__"}


def _panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [panel for panel in board["panels"] if panel["type"] != "row"]


def test_committed_json_is_what_the_code_builds() -> None:
    stale = dashboards.stale_dashboards(COMMITTED)
    assert not stale, f"run `gym-obs dashboards build`: {[str(path) for path in stale]}"
    assert sorted(path.name for path in COMMITTED.glob("*.json")) == sorted(_BUILT)


def test_build_is_deterministic() -> None:
    again = dashboards.build_dashboards()
    assert {name: dashboards.render_dashboard(model) for name, model in again.items()} == {
        name: dashboards.render_dashboard(model) for name, model in _BUILT.items()
    }


def test_cli_build_writes_the_committed_files_and_check_detects_drift(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dashboards", "build", "--out", str(tmp_path)]) == 0
    for name in _BUILT:
        assert (tmp_path / name).read_text() == (COMMITTED / name).read_text()
    assert main(["dashboards", "build", "--out", str(tmp_path), "--check"]) == 0
    (tmp_path / "gym-servers.json").write_text("{}")
    assert main(["dashboards", "build", "--out", str(tmp_path), "--check"]) == 1
    assert "gym-servers.json" in capsys.readouterr().err


def test_the_five_dashboards_exist_with_stable_uids() -> None:
    assert {model["uid"]: model["title"] for model in _BUILT.values()} == {
        "gym-rollouts": "gym / Rollouts overview",
        "gym-http-client": "gym / HTTP client and pools",
        "gym-servers": "gym / Servers",
        "gym-failures": "gym / Failures",
        "gym-processes": "gym / Processes",
        "gym-model-calls": "gym / Model calls",
    }
    for name, model in _BUILT.items():
        assert name == model["uid"] + ".json"
        assert "id" not in model  # provisioned dashboards are matched by uid


@pytest.mark.parametrize("name", sorted(_BUILT))
def test_panel_ids_are_unique_and_the_grid_does_not_overlap(name: str) -> None:
    panels = _panels(_BUILT[name])
    assert [panel["id"] for panel in panels] == list(range(1, len(panels) + 1))
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24
        area = {
            (x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & area, panel["title"]
        cells |= area


@pytest.mark.parametrize("name", sorted(_BUILT))
def test_every_query_filters_by_the_job_variable_and_uses_the_provisioned_datasource(name: str) -> None:
    board = _BUILT[name]
    job = next(var for var in board["templating"]["list"] if var["name"] == "job")
    assert job["includeAll"] and job["multi"] and job["allValue"] == ".*"
    assert job["datasource"]["uid"] == PROMETHEUS_DATASOURCE_UID
    for panel in _panels(board):
        assert panel["datasource"] == {"type": "prometheus", "uid": PROMETHEUS_DATASOURCE_UID}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == PROMETHEUS_DATASOURCE_UID
            assert f'{JOB_LABEL}=~"$job"' in target["expr"], panel["title"]


@pytest.mark.parametrize("name", sorted(_BUILT))
def test_histogram_panels_are_in_seconds_with_exemplars(name: str) -> None:
    histogram_panels = 0
    for panel in _panels(_BUILT[name]):
        if any("_bucket" in target["expr"] for target in panel["targets"]):
            histogram_panels += 1
            assert panel["fieldConfig"]["defaults"]["unit"] == "s", panel["title"]
            assert all(target["exemplar"] for target in panel["targets"]), panel["title"]
            assert all("histogram_quantile(" in target["expr"] for target in panel["targets"])
    if name != "gym-failures.json":
        assert histogram_panels >= 1


def test_every_metric_and_label_comes_from_the_names_registry() -> None:
    for board in _BUILT.values():
        for query in panel_queries(board):
            assert metric_names(query.expr) <= _SERIES, query.where
            labels = set(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)\s*\"", query.expr))
            for grouping in re.findall(r"\bby \(([^)]*)\)", query.expr):
                labels |= {label.strip() for label in grouping.split(",")}
            assert labels <= _ALLOWED_LABELS, (query.where, labels - _ALLOWED_LABELS)


def test_dashboard_sources_spell_no_metric_name() -> None:
    """Names come from telemetry.names through the mapping, never as string literals (in any module)."""
    literals = {spec.name for spec in GYM_METRICS} | {spec.prometheus for spec in GYM_METRICS}
    sources = sorted(Path(str(dashboards.__file__)).parent.glob("*.py"))
    assert {"_boards.py", "_panels.py", "_processes.py"} <= {path.name for path in sources}
    for path in sources:
        source = path.read_text()
        assert not {literal for literal in literals if literal in source}, path.name


def _exprs(uid: str) -> str:
    board = next(model for model in _BUILT.values() if model["uid"] == uid)
    return "\n".join(target["expr"] for panel in _panels(board) for target in panel["targets"])


def test_the_questions_each_dashboard_answers() -> None:
    label = prometheus_label
    rollouts = _exprs("gym-rollouts")
    assert f"by ({label(names.ATTR_ROLLOUT_OUTCOME)})" in rollouts
    assert dashboards.ROLLOUT_DURATION.series("_bucket") in rollouts
    assert f"by ({label(names.ATTR_FAILURE_KIND)})" in rollouts
    assert f"by ({label(names.ATTR_FAILURE_BOUNDARY)})" in rollouts

    client = _exprs("gym-http-client")
    assert f"by (le, {label(names.ATTR_SERVER_NAME)})" in client
    assert label(names.ATTR_RETRY_REASON) in client
    assert dashboards.POOL_WAIT_DURATION.series("_bucket") in client
    assert dashboards.POOL_PENDING_REQUESTS.series() in client
    assert label(names.ATTR_HTTP_CONNECTION_STATE) in client

    servers = _exprs("gym-servers")
    route, status = label(names.ATTR_HTTP_ROUTE), label(names.ATTR_HTTP_RESPONSE_STATUS_CODE)
    assert f"by (le, {route}, {status})" in servers
    assert f'{status}=~"5.."' in servers

    failures = _exprs("gym-failures")
    for attribute in (names.ATTR_FAILURE_KIND, names.ATTR_FAILURE_BOUNDARY, names.ATTR_FAILURE_STAGE):
        assert f"by ({label(attribute)})" in failures
