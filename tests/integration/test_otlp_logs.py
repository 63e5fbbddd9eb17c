"""Log records over OTLP: a real receiver gets the structured lines with their span's ids and no secret."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import structlog
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from gym_obs.telemetry.log_export import install_log_export, uninstall_log_export
from gym_obs.telemetry.logging import configure_logging
from tests.integration.otlp_receiver import OtlpReceiver, ReceivedLog

PORT = 29950
SECRET = "sk-live-CANARYc4n4ryS3cr3tV4lue0123456789"


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver(PORT) as receiver:
        yield receiver


def _export(receiver: OtlpReceiver) -> LoggerProvider:
    configure_logging(json=True)
    exporter = OTLPLogExporter(endpoint=f"{receiver.endpoint}/v1/logs", timeout=5)
    resource = Resource.create({"service.name": "gym/logs-test"})
    return install_log_export(exporter, resource, schedule_delay_ms=50)


def test_records_arrive_with_trace_ids_fields_and_no_secret(receiver: OtlpReceiver) -> None:
    provider = _export(receiver)
    tracer = TracerProvider().get_tracer("test")
    try:
        with tracer.start_as_current_span("work") as span:
            ids = span.get_span_context()
            structlog.get_logger("gym_obs.test").warning(
                "calling upstream", url=f"http://h/x?api_key={SECRET}", attempt=2, rollout_id="r-7"
            )
            logging.getLogger("somelib").error("Authorization: Bearer %s failed", SECRET)
            try:
                raise ValueError(f"token={SECRET}")
            except ValueError:
                logging.getLogger("somelib").exception("boom")
        logging.getLogger("opentelemetry.sdk.test").warning("never exported")
    finally:
        uninstall_log_export(provider)

    logs = receiver.wait_for_logs(lambda got: len(got) >= 3)
    by_body = {record.body: record for record in logs}
    assert set(by_body) >= {"calling upstream", "boom"}, by_body.keys()
    upstream: ReceivedLog = by_body["calling upstream"]
    assert upstream.trace_id == format(ids.trace_id, "032x")
    assert upstream.span_id == format(ids.span_id, "016x")
    assert upstream.severity_text == "WARNING"
    assert upstream.service_name == "gym/logs-test"
    assert upstream.scope == "gym_obs.test"
    assert upstream.attributes["attempt"] == 2
    assert upstream.attributes["gym.rollout.id"] == "r-7"
    assert upstream.attributes["url"] == "http://h/x"  # scrubbed exactly as the rendered line is
    boom = by_body["boom"]
    assert "ValueError" in boom.attributes["exception.stacktrace"]
    assert not any(record.scope.startswith("opentelemetry") for record in logs)
    for record in logs:
        assert SECRET not in repr(record), record


def test_a_dead_endpoint_never_blocks_or_recurses(caplog: pytest.LogCaptureFixture) -> None:
    configure_logging(json=True)
    exporter = OTLPLogExporter(endpoint="http://127.0.0.1:29951/v1/logs", timeout=1)
    provider = install_log_export(exporter, Resource.create({}), schedule_delay_ms=20)
    try:
        for index in range(5000):  # more than the queue holds: dropped, never waited for
            logging.getLogger("busy").info("line %d", index)
        provider.force_flush(3000)
    finally:
        uninstall_log_export(provider)
    failures = [
        record
        for record in caplog.records
        if record.name == "gym_obs.telemetry" and "otlp logs export failed" in record.getMessage()
    ]
    assert len(failures) == 1, [record.getMessage() for record in failures]
