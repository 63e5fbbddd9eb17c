"""Fault plan: the YAML schema of issue 6, validated with errors that name the bad key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gym_obs.harness.faults import FaultPlan, FaultPlanError, FaultSelector, load_fault_plan, parse_fault_plan

ISSUE_EXAMPLE = """
faults:
  - server: resources          # role (agent | model | resources) or a configured server name
    route: /verify
    rate: 0.2                  # fraction of requests
    action: raise
    exception: ZeroDivisionError   # for raise
  - server: model
    route: /v1/responses
    rate: 0.1
    action: status
    status: 503                # for status
  - server: model_1
    route: /v1/*
    action: delay
    seconds: 0.5               # for delay
"""


def test_issue_example_loads(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(ISSUE_EXAMPLE)
    plan = load_fault_plan(path)
    assert [rule.action for rule in plan.faults] == ["raise", "status", "delay"]
    assert plan.faults[0].exception_class() is ZeroDivisionError
    assert plan.faults[1].status == 503
    assert plan.faults[2].seconds == 0.5


@pytest.mark.parametrize(
    ("rule", "needle"),
    [
        ({"server": "model", "route": "/x", "actoin": "raise"}, "faults[0].actoin"),
        ({"server": "model", "route": "/x", "action": "explode"}, "faults[0].action"),
        ({"server": "model", "route": "/x", "action": "raise", "rate": 1.5}, "faults[0].rate"),
        ({"server": "model", "route": "/x", "action": "status"}, "needs 'status'"),
        ({"server": "model", "route": "/x", "action": "status", "status": 200}, "faults[0].status"),
        ({"server": "model", "route": "/x", "action": "delay"}, "needs 'seconds'"),
        ({"server": "model", "route": "/x", "action": "raise", "seconds": 1}, "'seconds' does not apply"),
        ({"server": "model", "route": "/x", "action": "raise", "exception": "os.system"}, "not a builtin"),
        ({"server": "model", "route": "/x", "action": "raise", "exception": "print"}, "not a builtin"),
        ({"route": "/x", "action": "raise"}, "faults[0].server"),
    ],
)
def test_bad_rules_name_the_key(rule: dict[str, object], needle: str) -> None:
    with pytest.raises(FaultPlanError) as info:
        parse_fault_plan({"faults": [rule]}, source="plan.yaml")
    assert needle in str(info.value)
    assert str(info.value).startswith("plan.yaml: ")


def test_bad_documents(tmp_path: Path) -> None:
    with pytest.raises(FaultPlanError, match="expected a mapping"):
        parse_fault_plan(["faults"])
    with pytest.raises(FaultPlanError, match=r"unknown|Extra inputs"):
        parse_fault_plan({"fautls": []})
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("faults: [\n")
    with pytest.raises(FaultPlanError, match="not valid YAML"):
        load_fault_plan(bad_yaml)
    with pytest.raises(FaultPlanError, match="cannot read"):
        load_fault_plan(tmp_path / "missing.yaml")
    assert parse_fault_plan(None) == FaultPlan()


def test_selector_keeps_only_its_rules_and_counts() -> None:
    plan = parse_fault_plan(
        {
            "faults": [
                {"server": "resources", "route": "/verify", "action": "status", "status": 500},
                {"server": "model_0", "route": "/v1/responses", "action": "disconnect"},
                {"server": "model", "route": "/v1/*", "action": "huge_body", "rate": 0.0},
            ]
        }
    )
    selector = FaultSelector("model", "model_0", plan, seed=1)
    assert [rule.action for rule in selector.plan.faults] == ["disconnect", "huge_body"]
    assert selector.pick("/v1/responses") is not None
    assert selector.pick("/other") is None
    assert selector.injected() == {"disconnect": 1}
    # rate 0.0 never fires; rate 1.0 always fires
    selector.set_plan(parse_fault_plan({"faults": [plan.faults[2]]}))
    assert all(selector.pick("/v1/responses") is None for _ in range(100))


def test_rate_is_a_fraction() -> None:
    plan = parse_fault_plan(
        {"faults": [{"server": "agent", "route": "/run", "action": "delay", "seconds": 1, "rate": 0.25}]}
    )
    selector = FaultSelector("agent", "agent_0", plan, seed=7)
    hits = sum(selector.pick("/run") is not None for _ in range(4000))
    assert 800 < hits < 1200
