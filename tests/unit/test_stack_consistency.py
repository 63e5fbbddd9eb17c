"""Consistency across the stack's files: collector pipelines, ports, scrape targets, datasource uids.

Each config is valid on its own and still the stack can be dead: a pipeline naming an undefined processor,
Prometheus scraping a port the collector does not serve, a dashboard pointing at a datasource uid Grafana
never provisioned. These tests read every file and check the joints.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import DEFAULT_ENDPOINT as HTTP_DEFAULT_ENDPOINT

from gym_obs import dashboards
from gym_obs.config import TelemetryConfig
from gym_obs.telemetry.settings import resolve_settings
from tests.e2e.promql_check import metric_names, panel_queries

ROOT = Path(__file__).resolve().parents[2]
COLLECTOR_DIR = ROOT / "collector"
COLLECTOR_CONFIGS = ("otel-collector.yaml", "agent.yaml", "gateway.yaml")
SECTIONS = ("receivers", "processors", "exporters", "connectors")


def _yaml(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(path.read_text())
    return loaded


def _collector(name: str = "otel-collector.yaml") -> dict[str, Any]:
    return _yaml(COLLECTOR_DIR / name)


def _compose() -> dict[str, Any]:
    return _yaml(ROOT / "docker-compose.yml")


def _port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1].rstrip("/"))


def _datasources() -> dict[str, dict[str, Any]]:
    provisioning = _yaml(ROOT / "dashboards/provisioning/datasources/gym-datasources.yaml")
    return {source["uid"]: source for source in provisioning["datasources"]}


# --- collector pipelines ----------------------------------------------------------------------------------


@pytest.mark.parametrize("config_name", COLLECTOR_CONFIGS)
def test_every_pipeline_component_is_defined_and_every_definition_used(config_name: str) -> None:
    config = _collector(config_name)
    used: dict[str, set[str]] = {section: set() for section in SECTIONS}
    pipelines = config["service"]["pipelines"]
    assert pipelines
    for pipeline_name, pipeline in pipelines.items():
        assert pipeline.get("receivers") and pipeline.get("exporters"), pipeline_name
        for section in ("receivers", "processors", "exporters"):
            for component in pipeline.get(section, []):
                defined = config.get(section, {}) or {}
                connectors = config.get("connectors", {}) or {}
                assert component in defined or component in connectors, (pipeline_name, section, component)
                used[section if component in defined else "connectors"].add(component)
    for section in SECTIONS:
        assert set(config.get(section, {}) or {}) == used[section], (section, "defined but unused")
    assert set(config["service"].get("extensions", [])) == set(config.get("extensions", {}))


@pytest.mark.parametrize("config_name", COLLECTOR_CONFIGS)
def test_memory_limiter_first_and_batch_last_in_every_pipeline(config_name: str) -> None:
    config = _collector(config_name)
    for pipeline_name, pipeline in config["service"]["pipelines"].items():
        processors = pipeline["processors"]
        assert processors[0].split("/")[0] == "memory_limiter", pipeline_name
        assert processors[-1].split("/")[0] == "batch", pipeline_name
    limiter = config["processors"]["memory_limiter"]
    assert (
        limiter["check_interval"]
        and 0 < limiter["spike_limit_percentage"] < limiter["limit_percentage"] <= 90
    )


@pytest.mark.parametrize("config_name", ["otel-collector.yaml", "agent.yaml"])
def test_redaction_backstop_strips_query_strings_from_url_attributes(config_name: str) -> None:
    config = _collector(config_name)
    transform = config["processors"]["transform/redact_urls"]
    span_statements = [
        statement
        for block in transform["trace_statements"]
        if block["context"] == "span"
        for statement in block["statements"]
    ]
    assert 'replace_pattern(attributes["url.full"], "[?#].*$", "")' in span_statements
    assert 'delete_key(attributes, "url.query")' in span_statements
    assert transform["metric_statements"]
    for pipeline_name, pipeline in config["service"]["pipelines"].items():
        assert "transform/redact_urls" in pipeline["processors"], pipeline_name


def test_redaction_pattern_removes_query_and_fragment() -> None:
    """The OTTL pattern, applied with a regex engine of the same (RE2-compatible) syntax."""
    pattern = "[?#].*$"
    assert re.sub(pattern, "", "https://h/v1/x?api_key=s3cret&b=2#frag") == "https://h/v1/x"
    assert re.sub(pattern, "", "https://h/v1/x") == "https://h/v1/x"


# --- ports and endpoints ----------------------------------------------------------------------------------


def test_otlp_ports_agree_between_collector_compose_and_sdk_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    protocols = _collector()["receivers"]["otlp"]["protocols"]
    grpc_port, http_port = _port(protocols["grpc"]["endpoint"]), _port(protocols["http"]["endpoint"])
    assert (grpc_port, http_port) == (4317, 4318)
    assert protocols["grpc"]["endpoint"].startswith("0.0.0.0:")  # reachable through the published port

    published = {
        int(port.split(":")[1]): int(port.split(":")[2])
        for port in _compose()["services"]["otel-collector"]["ports"]
    }
    assert published == {grpc_port: grpc_port, http_port: http_port}

    for variable in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(variable, raising=False)
    grpc_exporter = GrpcSpanExporter()
    try:
        assert _port(grpc_exporter._endpoint) == grpc_port  # the SDK's documented default
    finally:
        grpc_exporter.shutdown()
    assert urlsplit(HTTP_DEFAULT_ENDPOINT).port == http_port


@pytest.mark.parametrize(("protocol", "port"), [("grpc", 4317), ("http/protobuf", 4318)])
def test_gym_default_otlp_endpoint_reaches_the_published_collector_port(protocol: str, port: int) -> None:
    config = TelemetryConfig(
        enabled=True, traces_exporter="otlp", metrics_exporter="otlp", otlp_protocol=protocol
    )
    settings = resolve_settings(config, {})
    published = {int(item.split(":")[1]) for item in _compose()["services"]["otel-collector"]["ports"]}
    for target in (settings.otlp_traces, settings.otlp_metrics):
        assert target is not None
        url = urlsplit(target.endpoint)
        assert (url.hostname, url.port) == ("localhost", port)
        assert url.port in published


def test_collector_sends_traces_to_tempo_receiver() -> None:
    exporter = _collector()["exporters"]["otlp/tempo"]
    host, port = exporter["endpoint"].split(":")
    assert host == "tempo" and host in _compose()["services"]
    tempo = _yaml(COLLECTOR_DIR / "tempo.yaml")
    assert _port(tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]) == int(port)


def test_prometheus_scrapes_exactly_what_the_collector_exports() -> None:
    collector = _collector()
    exporter = collector["exporters"]["prometheus"]
    assert exporter["enable_open_metrics"] is True  # exemplars travel only in OpenMetrics
    assert exporter["resource_to_telemetry_conversion"]["enabled"] is False
    export_target = f"otel-collector:{_port(exporter['endpoint'])}"
    telemetry = collector["service"]["telemetry"]["metrics"]["readers"][0]["pull"]["exporter"]["prometheus"]
    telemetry_target = f"otel-collector:{telemetry['port']}"

    prometheus = _yaml(COLLECTOR_DIR / "prometheus.yml")
    by_target = {
        target: job
        for job in prometheus["scrape_configs"]
        for sc in job["static_configs"]
        for target in sc["targets"]
    }
    collector_targets = {target for target in by_target if target.startswith("otel-collector:")}
    assert collector_targets == {export_target, telemetry_target}
    # honor_labels keeps job = service.name set by the exporter; only the gym export job may honour them.
    assert [job["job_name"] for job in prometheus["scrape_configs"] if job.get("honor_labels")] == [
        by_target[export_target]["job_name"]
    ]
    assert prometheus["storage"]["exemplars"]["max_exemplars"] > 0


def test_tempo_remote_writes_to_prometheus_receiver() -> None:
    tempo = _yaml(COLLECTOR_DIR / "tempo.yaml")
    (remote_write,) = tempo["metrics_generator"]["storage"]["remote_write"]
    url = urlsplit(remote_write["url"])
    assert (url.hostname, url.port, url.path) == ("prometheus", 9090, "/api/v1/write")
    assert remote_write["send_exemplars"] is True
    assert "--web.enable-remote-write-receiver" in _compose()["services"]["prometheus"]["command"]
    processors = tempo["overrides"]["defaults"]["metrics_generator"]["processors"]
    assert "service-graphs" in processors


def test_promtool_check_config() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: scripts/test.sh installs Debian's prometheus package"
    result = subprocess.run(
        [promtool, "check", "config", str(COLLECTOR_DIR / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --- Grafana ----------------------------------------------------------------------------------------------


def test_dashboards_reference_only_provisioned_datasources() -> None:
    provisioned = _datasources()
    referenced = set()
    for board in dashboards.build_dashboards().values():
        for panel in board["panels"]:
            referenced.add(panel["datasource"]["uid"])
            referenced |= {target["datasource"]["uid"] for target in panel.get("targets", [])}
        referenced |= {variable["datasource"]["uid"] for variable in board["templating"]["list"]}
    assert referenced == {dashboards.PROMETHEUS_DATASOURCE_UID}
    assert set(provisioned) == {dashboards.PROMETHEUS_DATASOURCE_UID, dashboards.TEMPO_DATASOURCE_UID}


def test_datasources_point_at_the_compose_services_and_link_each_other() -> None:
    sources = _datasources()
    prometheus = sources[dashboards.PROMETHEUS_DATASOURCE_UID]
    tempo = sources[dashboards.TEMPO_DATASOURCE_UID]
    assert (prometheus["type"], prometheus["url"]) == ("prometheus", "http://prometheus:9090")
    tempo_port = _yaml(COLLECTOR_DIR / "tempo.yaml")["server"]["http_listen_port"]
    assert (tempo["type"], tempo["url"]) == ("tempo", f"http://tempo:{tempo_port}")
    assert {"prometheus", "tempo"} <= set(_compose()["services"])

    (exemplars,) = prometheus["jsonData"]["exemplarTraceIdDestinations"]
    assert exemplars == {"name": "trace_id", "datasourceUid": dashboards.TEMPO_DATASOURCE_UID}
    assert tempo["jsonData"]["tracesToMetrics"]["datasourceUid"] == dashboards.PROMETHEUS_DATASOURCE_UID
    assert tempo["jsonData"]["serviceMap"]["datasourceUid"] == dashboards.PROMETHEUS_DATASOURCE_UID
    assert {"key": "service.name", "value": "job"} in tempo["jsonData"]["tracesToMetrics"]["tags"]
    known = {spec.series(suffix) for spec in dashboards.GYM_METRICS for suffix in ("", "_bucket", "_count")}
    for query in tempo["jsonData"]["tracesToMetrics"]["queries"]:
        assert metric_names(query["query"]) <= known, query


def test_datasource_scrape_interval_matches_prometheus() -> None:
    scrape = _yaml(COLLECTOR_DIR / "prometheus.yml")["global"]["scrape_interval"]
    assert _datasources()[dashboards.PROMETHEUS_DATASOURCE_UID]["jsonData"]["timeInterval"] == scrape


def test_dashboard_provider_loads_the_generated_json() -> None:
    (provider,) = _yaml(ROOT / "dashboards/provisioning/dashboards/gym-dashboards.yaml")["providers"]
    grafana = _compose()["services"]["grafana"]
    mounts = {target: source for source, target, *_ in (volume.split(":") for volume in grafana["volumes"])}
    path = provider["options"]["path"]
    assert (ROOT / mounts[path]).resolve() == (ROOT / "dashboards").resolve()
    assert mounts["/etc/grafana/provisioning/dashboards"] == "./dashboards/provisioning/dashboards"
    assert mounts["/etc/grafana/provisioning/datasources"] == "./dashboards/provisioning/datasources"
    assert sorted(path.name for path in (ROOT / "dashboards").glob("*.json")) == sorted(
        dashboards.build_dashboards()
    )
    assert all(
        query.expr for board in dashboards.build_dashboards().values() for query in panel_queries(board)
    )


# --- the fleet tiers --------------------------------------------------------------------------------------


def test_agents_load_balance_traces_by_trace_id_to_the_gateway_receiver() -> None:
    agent, gateway = _collector("agent.yaml"), _collector("gateway.yaml")
    balancer = agent["exporters"]["loadbalancing"]
    assert balancer["routing_key"] == "traceID"
    assert agent["service"]["pipelines"]["traces"]["exporters"] == ["loadbalancing"]
    gateway_grpc = _port(gateway["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"])
    port = balancer["resolver"]["dns"]["port"]
    assert isinstance(port, str), "the resolver's port is a string field: an int fails strict decoding"
    assert int(port) == gateway_grpc
    metrics_balancer = agent["exporters"]["loadbalancing/metrics"]
    assert metrics_balancer["routing_key"] == "service"
    assert metrics_balancer["resolver"]["dns"] == balancer["resolver"]["dns"]


def test_gateway_tail_sampling_keeps_every_error_trace() -> None:
    gateway = _collector("gateway.yaml")
    policies = {policy["type"]: policy for policy in gateway["processors"]["tail_sampling"]["policies"]}
    assert policies["status_code"]["status_code"]["status_codes"] == ["ERROR"]
    assert 0 < policies["probabilistic"]["probabilistic"]["sampling_percentage"] < 100
    assert "tail_sampling" in gateway["service"]["pipelines"]["traces"]["processors"]
    assert "tail_sampling" not in gateway["service"]["pipelines"]["metrics"]["processors"]


# --- the gym collector distribution (collector/builder-config.yaml) ---------------------------------------

MANIFEST_KINDS = {
    "receivers": "receiver",
    "processors": "processor",
    "exporters": "exporter",
    "extensions": "extension",
}


def _manifest() -> dict[str, Any]:
    return _yaml(COLLECTOR_DIR / "builder-config.yaml")


def _manifest_modules() -> dict[str, set[str]]:
    """Per kind, the component types the manifest builds in (``.../otlpreceiver`` -> ``otlp``)."""
    built: dict[str, set[str]] = {}
    for section, kind in MANIFEST_KINDS.items():
        for entry in _manifest().get(section, []):
            module = entry["gomod"].split()[0].rsplit("/", 1)[1]
            assert module.endswith(kind), (section, module)
            built.setdefault(section, set()).add(module.removesuffix(kind))
    return built


def _used_components() -> dict[str, set[str]]:
    """Per kind, the component types the three configs use, in the manifest's spelling (no ``_``)."""
    used: dict[str, set[str]] = {}
    for name in COLLECTOR_CONFIGS:
        config = _collector(name)
        for section in MANIFEST_KINDS:
            for key in config.get(section, {}):
                used.setdefault(section, set()).add(key.split("/")[0].replace("_", ""))
    return used


def test_manifest_builds_exactly_the_components_the_configs_use() -> None:
    assert _manifest_modules() == _used_components()


def test_manifest_keeps_every_collector_module_at_one_release() -> None:
    manifest = _manifest()
    release = manifest["dist"]["version"]
    versions = {}
    for section in (*MANIFEST_KINDS, "providers"):
        for entry in manifest.get(section, []):
            module, version = entry["gomod"].split()
            versions[module] = version
    core = {
        v
        for m, v in versions.items()
        if m.startswith("go.opentelemetry.io/collector/") and v.startswith("v0.")
    }
    contrib = {v for m, v in versions.items() if "opentelemetry-collector-contrib" in m}
    stable = {v for m, v in versions.items() if v.startswith("v1.")}
    assert core == contrib == {f"v{release}"}
    assert len(stable) == 1  # the 1.x modules (config providers) of the same core release
    providers = {entry["gomod"].split()[0].rsplit("/", 1)[1] for entry in manifest["providers"]}
    assert providers == {"envprovider", "fileprovider", "yamlprovider"}


def test_compose_pins_the_contrib_image_at_the_manifest_release() -> None:
    image = _compose()["services"]["otel-collector"]["image"]
    repository, tag = image.rsplit(":", 1)
    assert repository == "otel/opentelemetry-collector-contrib"
    assert tag == _manifest()["dist"]["version"]
