"""The generated global config: servers, telemetry modes, Prometheus targets; the CLI's arguments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gym_obs.cli import build_parser
from gym_obs.harness.faults import FaultPlanError, parse_fault_plan
from gym_obs.harness.servers import ENTRYPOINTS
from gym_obs.harness.servers.agent import AgentSettings
from gym_obs.harness.servers.model import ModelSettings
from gym_obs.harness.stack import HarnessOptions, build_layout, write_prometheus_targets
from gym_obs.server.base_server import import_server_class


def test_default_layout_is_the_embedded_file_sink(tmp_path: Path) -> None:
    layout = build_layout(HarnessOptions(out=tmp_path, agents=2, models=3, resources=1))
    config = layout.config
    assert list(config.servers) == ["agent_0", "agent_1", "model_0", "model_1", "model_2", "resources_0"]
    assert config.head_server.port == 11000
    assert [s.port for s in config.servers.values()] == list(range(11001, 11007))
    assert layout.roles["model_2"] == "model" and layout.agents == ["agent_0", "agent_1"]
    telemetry = config.telemetry
    assert telemetry.enabled and telemetry.traces_exporter == "file" and telemetry.metrics_exporter == "file"
    assert telemetry.file_export_dir == str((tmp_path / "telemetry").resolve())
    agent = AgentSettings.model_validate(config.servers["agent_1"].own_config())
    assert agent.models == ["model_0", "model_1", "model_2"] and agent.resources == ["resources_0"]
    ModelSettings.model_validate(config.servers["model_0"].own_config())
    assert layout.prometheus_targets == {}
    assert write_prometheus_targets(layout, tmp_path) is None


def test_otlp_prometheus_and_off(tmp_path: Path) -> None:
    layout = build_layout(
        HarnessOptions(
            out=tmp_path,
            otlp_endpoint="http://127.0.0.1:4318",
            prometheus_port_base=19000,
            port_base=18000,
        )
    )
    assert layout.config.telemetry.traces_exporter == "otlp"
    assert layout.config.telemetry.metrics_exporter == "otlp,file"  # files feed the summary
    assert layout.driver_telemetry.metrics_exporter == "otlp,file,prometheus"
    assert layout.driver_telemetry.prometheus_port == 19000
    assert layout.config.servers["model_0"].own_config()["prometheus_port"] == 19002
    path = write_prometheus_targets(layout, tmp_path)
    assert path is not None
    groups = json.loads(path.read_text())
    assert {g["labels"]["job"]: g["targets"] for g in groups} == {
        "gym/harness": ["127.0.0.1:19000"],
        "gym/agent_0": ["127.0.0.1:19001"],
        "gym/model_0": ["127.0.0.1:19002"],
        "gym/resources_0": ["127.0.0.1:19003"],
    }
    assert {port for port, _ in layout.ports()} == {18000, 18001, 18002, 18003, 19000, 19001, 19002, 19003}
    off = build_layout(HarnessOptions(out=tmp_path, telemetry=False, prometheus_port_base=19000))
    assert off.config.telemetry.enabled is False and off.prometheus_targets == {}


def test_plan_is_passed_to_every_server_and_checked(tmp_path: Path) -> None:
    plan = parse_fault_plan(
        {"faults": [{"server": "model_1", "route": "/v1/responses", "action": "disconnect"}]}
    )
    layout = build_layout(HarnessOptions(out=tmp_path, models=2, fault_plan=plan))
    assert layout.config.servers["agent_0"].own_config()["fault_plan"]["faults"][0]["server"] == "model_1"
    with pytest.raises(FaultPlanError, match=r"faults\[0\].server: 'model_1'"):
        build_layout(HarnessOptions(out=tmp_path, models=1, fault_plan=plan))


def test_entrypoints_import() -> None:
    for role, entrypoint in ENTRYPOINTS.items():
        cls = import_server_class(entrypoint)
        assert cls.role == role  # type: ignore[attr-defined]


def test_cli_arguments() -> None:
    args = build_parser().parse_args(
        [
            "harness",
            "run",
            "--rollouts",
            "5",
            "--concurrency",
            "2",
            "--agents",
            "2",
            "--models",
            "3",
            "--resources",
            "1",
            "--faults",
            "plan.yaml",
            "--otlp-endpoint",
            "http://c:4318",
            "--prometheus-port-base",
            "9100",
            "--out",
            "o",
        ]
    )
    assert (args.rollouts, args.concurrency, args.agents, args.models, args.resources) == (5, 2, 2, 3, 1)
    assert args.faults == Path("plan.yaml") and args.prometheus_port_base == 9100 and args.out == Path("o")
    defaults = build_parser().parse_args(["harness", "run"])
    assert (defaults.rollouts, defaults.concurrency, defaults.otlp_endpoint) == (200, 32, None)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["harness", "run", "--rollouts", "0"])


def test_rules_that_can_never_fire_are_warned_about() -> None:
    from gym_obs.harness.faults import parse_fault_plan
    from gym_obs.harness.stack import plan_warnings

    plan = parse_fault_plan(
        {
            "faults": [
                {"server": "model", "route": "/verify", "action": "disconnect"},
                {"server": "model_1", "route": "/v1/*", "action": "disconnect"},
                {"server": "resources", "route": "*", "action": "disconnect"},
            ]
        }
    )
    warnings = plan_warnings(plan)
    assert (
        len(warnings) == 1 and "faults[0].route '/verify'" in warnings[0] and "/v1/responses" in warnings[0]
    )
