"""collector/alerts.yml, checked and unit-tested by the real promtool (Debian's prometheus package).

``alerts_test.yml`` gives every rule a series that must fire it beside one that must not. These tests run
it, prove that each rule really has a firing case (a rule replaced by one that can never fire makes
promtool fail), and check that the rules only use metric names the names registry produces.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gym_obs import dashboards

COLLECTOR_DIR = Path(__file__).resolve().parents[2] / "collector"
ALERTS = COLLECTOR_DIR / "alerts.yml"
ALERTS_TEST = COLLECTOR_DIR / "alerts_test.yml"
NEVER_FIRES = "vector(1) == 0"


def _promtool() -> str:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: scripts/test.sh installs Debian's prometheus package"
    return promtool


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def _rules(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _load(path: Path) -> dict[str, Any]:
    loaded = yaml.safe_load(path.read_text())
    assert isinstance(loaded, dict)
    return loaded


def _alert_names() -> list[str]:
    return [rule["alert"] for rule in _rules(_load(ALERTS))]


def test_promtool_check_rules_passes() -> None:
    result = _run("check", "rules", str(ALERTS), cwd=COLLECTOR_DIR)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_alert_names())} rules found" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    result = _run("test", "rules", str(ALERTS_TEST), cwd=COLLECTOR_DIR)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_rule_has_a_firing_and_a_silent_case() -> None:
    """Read from the test file: each alert is expected to fire at least once, and the same test also holds
    a series that must not fire it (a ``_quiet`` series, or an evaluation expecting no alert)."""
    fires: set[str] = set()
    silent: set[str] = set()
    for case in _load(ALERTS_TEST)["tests"]:
        series = " ".join(item["series"] for item in case["input_series"])
        for check in case["alert_rule_test"]:
            if check.get("exp_alerts"):
                fires.add(check["alertname"])
                if "_quiet" in series:
                    silent.add(check["alertname"])
            else:
                silent.add(check["alertname"])
    names = set(_alert_names())
    assert names <= fires, f"rules without a firing test case: {sorted(names - fires)}"
    assert names <= silent, f"rules without a silent test case: {sorted(names - silent)}"
    assert fires <= names, f"test cases for rules that do not exist: {sorted(fires - names)}"


@pytest.mark.parametrize("alert", _alert_names())
def test_a_rule_that_cannot_fire_fails_its_test(alert: str, tmp_path: Path) -> None:
    doc = _load(ALERTS)
    for rule in _rules(doc):
        if rule["alert"] == alert:
            rule["expr"] = NEVER_FIRES
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    shutil.copy(ALERTS_TEST, tmp_path / "alerts_test.yml")
    result = _run("test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert result.returncode != 0
    assert f"alertname: {alert}" in result.stdout + result.stderr


def _known_series() -> set[str]:
    known = {"up", "target_info"}
    for spec in dashboards.GYM_METRICS:
        suffixes = ("_bucket", "_sum", "_count") if spec.kind == "histogram" else ("",)
        known.update(spec.series(suffix) for suffix in suffixes)
    return known


def test_rules_use_only_registered_metric_names() -> None:
    """A renamed metric in names.py must break this test, not silently mute an alert."""
    identifier = re.compile(r"\b(?:gym|http)_[a-z_]+\b")
    labels = re.compile(r"\bby\s*\([^)]*\)|\{[^}]*\}")  # grouping labels and selectors are not metrics
    used: set[str] = set()
    for rule in _rules(_load(ALERTS)):
        used.update(identifier.findall(labels.sub(" ", rule["expr"])))
    assert used, "no metric found in the rules"
    assert used <= _known_series(), sorted(used - _known_series())


def test_annotations_name_a_committed_dashboard_and_panel() -> None:
    boards = {uid: model for uid, model in dashboards.build_dashboards().items()}
    titles = {
        model["uid"]: {panel.get("title", "") for panel in model["panels"]} for model in boards.values()
    }
    for rule in _rules(_load(ALERTS)):
        annotations = rule["annotations"]
        match = re.search(r"\(uid ([a-z0-9-]+)\)", annotations["dashboard"])
        assert match and match.group(1) in titles, annotations["dashboard"]
        panel = annotations["panel"]
        assert panel in titles[match.group(1)], (rule["alert"], panel)
