"""Issue 16.5 on a launched server: with ``logs_exporter: otlp,file`` the log records a request handler
writes reach a real OTLP receiver (and the file sink) with that request's trace id and no secret.

Ports 29960-29969.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from gym_obs.config import parse_global_config
from gym_obs.server.launcher import launch
from gym_obs.telemetry.file_export import LOGS_SUFFIX
from tests.integration.otlp_receiver import LAUNCH_ENV, OtlpReceiver
from tests.integration.server_apps import LOG_CANARY

pytestmark = pytest.mark.integration

RECEIVER_PORT, HEAD_PORT, SERVER_PORT = 29960, 29961, 29962


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver(RECEIVER_PORT) as running:
        yield running


async def test_a_handlers_log_lines_arrive_with_its_trace_id_and_no_secret(
    receiver: OtlpReceiver, tmp_path: Path
) -> None:
    sink = tmp_path / "telemetry"
    config = parse_global_config(
        {
            "head_server": {"port": HEAD_PORT},
            "telemetry": {
                "enabled": True,
                "traces_exporter": "otlp",
                "metrics_exporter": "none",
                "logs_exporter": "otlp,file",
                "otlp_endpoint": receiver.endpoint,
                "otlp_protocol": "http/protobuf",
                "file_export_dir": str(sink),
            },
            "servers": {
                "logger": {
                    "entrypoint": "tests.integration.server_apps:LoggingServer",
                    "server_type": "resources_servers",
                    "port": SERVER_PORT,
                }
            },
        }
    )
    with launch(config, log_dir=tmp_path / "logs", env=LAUNCH_ENV):
        url = f"http://127.0.0.1:{SERVER_PORT}/log"
        async with aiohttp.ClientSession() as http, http.post(url, json={"n": 7}) as reply:
            assert reply.status == 200
            ids = await reply.json()
        logs = receiver.wait_for_logs(lambda got: any(r.body == "handled a request" for r in got))
    (record,) = [r for r in logs if r.body == "handled a request"]
    assert record.trace_id == ids["trace_id"] and record.span_id == ids["span_id"]
    assert record.service_name == "gym/logger"
    assert record.attributes["gym.server.name"] == "logger"
    assert record.attributes["n"] == 7
    assert record.severity_text == "WARNING"
    for got in logs:
        assert LOG_CANARY not in repr(got)
    # the server's SERVER span is the one the line names
    spans = receiver.wait_for(lambda got: any(s.span_id == ids["span_id"] for s in got))
    assert any(s.span_id == ids["span_id"] and s.trace_id == ids["trace_id"] for s in spans)

    lines = [line for path in sink.glob(f"*{LOGS_SUFFIX}") for line in path.read_text().splitlines()]
    assert lines, list(sink.iterdir())
    text = "\n".join(lines)
    assert LOG_CANARY not in text
    bodies = [
        (rec["body"]["stringValue"], rec.get("traceId"))
        for line in lines
        for rl in json.loads(line)["resourceLogs"]
        for sl in rl["scopeLogs"]
        for rec in sl["logRecords"]
    ]
    assert ("handled a request", ids["trace_id"]) in bodies
