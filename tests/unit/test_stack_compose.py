"""docker-compose.yml: a real compose implementation and the compose-spec schema accept it; house rules.

No Docker engine runs here: ``docker-compose config -q`` (Debian's compose, installed by scripts/test.sh)
validates and interpolates without one, and the current compose-spec JSON schema comes from the
check-jsonschema package (vendored there, refreshed with each release), since nothing can be downloaded.
"""

from __future__ import annotations

import importlib.resources
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
COLLECTOR = "otel-collector"


def _compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return loaded


def _services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = _compose()["services"]
    return services


def test_docker_compose_config_accepts_the_file() -> None:
    binary = shutil.which("docker-compose")
    assert binary, "docker-compose is missing: scripts/test.sh installs Debian's package"
    result = subprocess.run(
        [binary, "--project-directory", str(ROOT), "-f", str(COMPOSE_FILE), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_docker_compose_config_rejects_a_broken_file(tmp_path: Path) -> None:
    """The validator is not a no-op: an unknown key fails it."""
    broken = _compose()
    broken["services"]["grafana"]["memory"] = "1g"
    path = tmp_path / "docker-compose.yml"
    path.write_text(yaml.safe_dump(broken))
    binary = shutil.which("docker-compose")
    assert binary
    result = subprocess.run(
        [binary, "-f", str(path), "config", "-q"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode != 0
    assert "memory" in result.stderr


def _compose_spec_validator() -> jsonschema.protocols.Validator:
    vendor = importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
    schema = json.loads(vendor.joinpath("compose-spec.json").read_text())
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    validator: jsonschema.protocols.Validator = validator_class(
        schema, format_checker=validator_class.FORMAT_CHECKER
    )
    return validator


def test_compose_file_matches_the_compose_spec_schema() -> None:
    errors = [
        f"{list(error.absolute_path)}: {error.message}"
        for error in _compose_spec_validator().iter_errors(_compose())
    ]
    assert not errors


def test_compose_spec_schema_rejects_a_broken_file() -> None:
    broken = _compose()
    broken["services"]["grafana"]["depends_on"]["prometheus"]["condition"] = "service_ready"
    broken["services"]["tempo"]["memory"] = "1g"
    messages = " ".join(error.message for error in _compose_spec_validator().iter_errors(broken))
    assert "service_ready" in messages and "memory" in messages


def test_images_are_pinned() -> None:
    images = {name: service["image"] for name, service in _services().items()}
    assert set(images) == {"prometheus", "tempo", COLLECTOR, "grafana"}
    for name, image in images.items():
        assert re.fullmatch(r"[\w./-]+:v?\d+\.\d+\.\d+", image), (name, image)
    assert images[COLLECTOR].startswith("otel/opentelemetry-collector-contrib:")
    assert images["grafana"].split(":")[1].startswith("11.6.")  # the SDK variant the dashboards target
    assert images["prometheus"].split(":")[1].startswith("v3.")
    assert images["tempo"].split(":")[1].startswith("2.")


def test_only_grafana_and_otlp_are_published_on_loopback() -> None:
    published = {}
    for name, service in _services().items():
        for port in service.get("ports", []):
            host_ip, host_port, container_port = str(port).split(":")
            assert host_ip == "127.0.0.1", (name, port)
            published[int(host_port)] = (name, int(container_port))
    assert published == {3000: ("grafana", 3000), 4317: (COLLECTOR, 4317), 4318: (COLLECTOR, 4318)}


def test_healthchecks_and_ordered_startup() -> None:
    services = _services()
    checked = {name for name, service in services.items() if "test" in service.get("healthcheck", {})}
    disabled = {name for name, service in services.items() if service.get("healthcheck", {}).get("disable")}
    # The contrib collector image is FROM scratch and Tempo's is distroless: no shell or HTTP client to run
    # a check with. Each says so with an explicit `disable: true` (and the reason in a comment).
    assert disabled == {COLLECTOR, "tempo"}
    assert checked == set(services) - disabled
    text = COMPOSE_FILE.read_text()
    assert "FROM scratch" in text and "distroless" in text
    for name in checked:
        test = services[name]["healthcheck"]["test"]
        assert test[0] == "CMD" and "http://127.0.0.1:" in test[-1], name
    for name, service in services.items():
        for dependency, rule in service.get("depends_on", {}).items():
            assert dependency in services
            expected = "service_healthy" if dependency in checked else "service_started"
            assert rule == {"condition": expected}, (name, dependency)
    assert set(services["grafana"]["depends_on"]) == {"prometheus", "tempo", COLLECTOR}
    assert set(services[COLLECTOR]["depends_on"]) == {"prometheus", "tempo"}


def test_each_pinned_version_names_its_source() -> None:
    header = COMPOSE_FILE.read_text().split("services:")[0]
    for service in _services().values():
        repository, tag = service["image"].rsplit(":", 1)
        assert f"{repository} {tag}:" in header, repository


def test_memory_limits_everywhere() -> None:
    for name, service in _services().items():
        limit = service.get("mem_limit") or service.get("deploy", {}).get("resources", {}).get(
            "limits", {}
        ).get("memory")
        assert limit and re.fullmatch(r"\d+[mg]", str(limit)), name


def test_named_volumes_and_mounted_files_exist() -> None:
    compose = _compose()
    declared = set(compose["volumes"])
    used = set()
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), (name, source)
            else:
                used.add(source)
    assert used == declared == {"prometheus-data", "tempo-data", "grafana-data"}


def test_grafana_is_anonymous_admin_without_login() -> None:
    env = _services()["grafana"]["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Admin"
    assert env["GF_AUTH_DISABLE_LOGIN_FORM"] == "true"
    home = env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    mounts = dict(volume.split(":")[:2][::-1] for volume in _services()["grafana"]["volumes"])
    directory, _, file_name = home.rpartition("/")
    assert (ROOT / mounts[directory] / file_name).is_file()


@pytest.mark.parametrize("flag", ["--enable-feature=exemplar-storage", "--web.enable-remote-write-receiver"])
def test_prometheus_flags(flag: str) -> None:
    assert flag in _services()["prometheus"]["command"]
