"""configure_logging: ids on every line, secrets scrubbed before rendering, tracebacks without locals.

Run in subprocesses: logging configuration is process-global and pytest owns the test process's handlers.
"""

from __future__ import annotations

import json

from tests.unit.test_telemetry_setup import run_python

_EMIT = """
    import logging
    from gym_obs.telemetry.logging import configure_logging, get_logger
    from gym_obs.telemetry.testing import capture_telemetry
    from gym_obs.telemetry.spans import client_span, current_ids
    from gym_obs.telemetry.propagation import rollout_context
    configure_logging({json_arg})
    configure_logging({json_arg})  # idempotent: still one handler, one line per event
    log = get_logger("gym.test")
    log.info("outside any span")
    with capture_telemetry(), client_span("GET"), rollout_context("rollout-42"):
        print("IDS", *current_ids(), flush=True)
        log.info("hello token=abc123", url="http://u:pw@h/x?k=SECRETQ", n=3)
        logging.getLogger("thirdparty").warning("stdlib says Authorization: Bearer STDLIBSECRET")

        def handler(api_key="sk-LOCALSECRETabcdefghijklmnop"):
            raise ValueError("boom password=hunter2")

        try:
            handler()
        except ValueError:
            log.exception("request failed")
"""


def _ids(stdout: str) -> tuple[str, str]:
    line = next(line for line in stdout.splitlines() if line.startswith("IDS"))
    _, trace_id, span_id = line.split()
    return trace_id, span_id


def test_json_lines_carry_ids_and_no_secrets() -> None:
    result = run_python(_EMIT.format(json_arg="json=True"))
    assert result.returncode == 0, result.stderr
    trace_id, span_id = _ids(result.stdout)
    lines = [json.loads(line) for line in result.stderr.splitlines()]
    assert [line["event"] for line in lines] == [
        "outside any span",
        "hello token=[REDACTED]",
        "stdlib says Authorization: [REDACTED]",
        "request failed",
    ]
    outside, hello, stdlib, failed = lines
    assert "trace_id" not in outside and "rollout_id" not in outside
    for line in (hello, stdlib, failed):
        assert line["trace_id"] == trace_id
        assert line["span_id"] == span_id
        assert line["rollout_id"] == "rollout-42"
        assert "timestamp" in line and "level" in line
    assert hello["url"] == "http://REDACTED:REDACTED@h/x"
    assert hello["n"] == 3
    assert stdlib["logger"] == "thirdparty"
    (exc,) = failed["exception"]
    assert exc["exc_type"] == "ValueError"
    assert exc["exc_value"] == "boom password=[REDACTED]"
    assert all("locals" not in frame for frame in exc["frames"])
    for secret in ("abc123", "SECRETQ", "STDLIBSECRET", "hunter2", "LOCALSECRET", ":pw@"):
        assert secret not in result.stderr


def test_console_lines_carry_ids_and_no_secrets() -> None:
    result = run_python(_EMIT.format(json_arg="json=False"))
    assert result.returncode == 0, result.stderr
    trace_id, _ = _ids(result.stdout)
    err = result.stderr
    assert err.count("hello token=[REDACTED]") == 1
    assert f"trace_id={trace_id}" in err
    assert "rollout_id=rollout-42" in err
    assert "Traceback (most recent call last):" in err
    assert "ValueError: boom password=[REDACTED]" in err
    for secret in ("abc123", "SECRETQ", "STDLIBSECRET", "hunter2", "LOCALSECRET"):
        assert secret not in err


def test_json_default_comes_from_the_environment() -> None:
    code = """
        from gym_obs.telemetry.logging import configure_logging, get_logger
        configure_logging()
        get_logger("x").warning("plain", k=1)
    """
    as_json = run_python(code, {"GYM_OBS_LOG_JSON": "1"})
    assert json.loads(as_json.stderr)["event"] == "plain"
    as_text = run_python(code)
    assert "plain" in as_text.stderr and not as_text.stderr.startswith("{")
