"""Every shipped collector config passes ``otelcol-gym validate``: the collector's own strict decoding.

A structural check in Python cannot see that a field is a string in the collector's Go struct (the
loadbalancing resolver's ``port`` once was an int here, and the agent could not start). The real binary,
built from ``collector/builder-config.yaml``, decodes each file with the compose hostnames it names; a
broken copy (an unknown key; an int where a string is required) must fail, so the check is not a no-op.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.collector_stack import COLLECTOR_DIR, validate

pytestmark = pytest.mark.e2e

CONFIGS = ("otel-collector.yaml", "agent.yaml", "gateway.yaml")


@pytest.mark.parametrize("config_name", CONFIGS)
def test_shipped_config_validates(config_name: str) -> None:
    result = validate(COLLECTOR_DIR / config_name)
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_fleet_tests_static_resolver_override_validates() -> None:
    """The fleet test swaps the DNS resolver for a static list with ``--set``; that must decode too."""
    static = {"hostnames": ["127.0.0.2:30121", "127.0.0.3:30121"]}
    both = {
        f"exporters::{name}::resolver::static": static for name in ("loadbalancing", "loadbalancing/metrics")
    }
    # --set merges into the file, so the shipped DNS resolver is still there beside the static one: the
    # loadbalancing exporter accepts exactly one resolver.
    assert validate(COLLECTOR_DIR / "agent.yaml", both).returncode != 0
    off = {
        f"exporters::{name}::resolver::dns::enabled": False
        for name in ("loadbalancing", "loadbalancing/metrics")
    }
    result = validate(COLLECTOR_DIR / "agent.yaml", {**both, **off})
    assert result.returncode == 0, result.stderr[-3000:]


def _broken(tmp_path: Path, config_name: str, change: Any) -> Path:
    config = yaml.safe_load((COLLECTOR_DIR / config_name).read_text())
    change(config)
    path = tmp_path / config_name
    path.write_text(yaml.safe_dump(config))
    return path


def _unknown_key(config: dict[str, Any]) -> None:
    config["processors"]["batch"]["send_batch_sise"] = 100


def _int_port(config: dict[str, Any]) -> None:
    config["exporters"]["loadbalancing"]["resolver"]["dns"]["port"] = 4317


def _int_endpoint(config: dict[str, Any]) -> None:
    config["extensions"]["health_check"]["endpoint"] = 13133


@pytest.mark.parametrize(
    ("config_name", "change", "named"),
    [
        ("otel-collector.yaml", _unknown_key, "send_batch_sise"),
        ("gateway.yaml", _unknown_key, "send_batch_sise"),
        ("agent.yaml", _int_port, "port"),
        ("otel-collector.yaml", _int_endpoint, "endpoint"),
    ],
)
def test_a_broken_copy_fails_validation(tmp_path: Path, config_name: str, change: Any, named: str) -> None:
    result = validate(_broken(tmp_path, config_name, change))
    assert result.returncode != 0
    assert named in result.stderr, result.stderr[-3000:]
