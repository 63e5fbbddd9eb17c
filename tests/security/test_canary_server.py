"""One canary secret planted in every input a caller or peer controls, against real launched servers that
export telemetry to an OTLP receiver AND to the file sink; every output is grepped for it.

Inputs: query (every form), fragment, userinfo, headers (Authorization, cookies, API keys, the session
header, User-Agent), bodies, a request that fails validation, an upstream's error body, config secrets
(``session_secret``, secret-looking keys of a server's own config). Outputs: OTLP exports (traces and
metrics, raw bytes), span and metric files, every process's log (uvicorn access log on), reply headers (the
failure header decoded), the head server's served config.

Cases that also depend on other parts' fixes (span-event stack traces, remote report scrubbing, the
harness) are in ``test_canary_cross_layer.py``.

Ports: head 31100, front 31101, peer 31102, OTLP receiver 31190.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import pytest

from gym_obs.server.launcher import launch
from tests.security.canary_apps import CANARY, SECRET_TEXT, UPSTREAM_PROBLEM
from tests.security.canary_support import (
    Outputs,
    RawOtlpReceiver,
    canary_config,
    files_under,
    launch_env,
    raw_request,
)

pytestmark = pytest.mark.integration

HEAD_PORT = 31100
FRONT_PORT = 31101
PEER_PORT = 31102
RECEIVER_PORT = 31190
FRONT = f"http://127.0.0.1:{FRONT_PORT}"
HEAD = f"http://127.0.0.1:{HEAD_PORT}"


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outputs]:
    file_dir = tmp_path_factory.mktemp("telemetry")
    config = canary_config(HEAD_PORT, FRONT_PORT, PEER_PORT, RECEIVER_PORT, file_dir)
    logs = tmp_path_factory.mktemp("logs")
    with RawOtlpReceiver(RECEIVER_PORT) as receiver, launch(config, log_dir=logs, env=launch_env()) as run:
        yield Outputs(run, receiver, file_dir)


QUERY_FORMS = (
    f"/echo?x&q={CANARY}",
    f"/echo?{CANARY}",
    f"/echo?api_key={CANARY}&b=2",
    f"/echo?a=1;{CANARY}",
    f"/echo?%6B{CANARY[1:]}=1",  # percent-encoded: the decoded form is the canary
    f"/ng-rollout/r-1/echo?q={CANARY}",
)


def test_query_strings_reach_the_handler_but_no_output(outputs: Outputs) -> None:
    before = outputs.seen("/echo")
    for path in QUERY_FORMS:
        status, _, body = outputs.call(FRONT + path)
        assert status == 200, (path, body)
        sent = path.partition("?")[2].encode()
        assert json.loads(body)["query_sha256"] == hashlib.sha256(sent).hexdigest(), path  # handler has it
    spans = outputs.wait_spans("/echo", before, len(QUERY_FORMS))
    for span in spans[before:]:
        assert "url.query" not in span.attributes and "http.target" not in span.attributes
        assert span.attributes["url.path"] == "/echo"
    outputs.wait_logged("GET /echo HTTP/1.1")  # the access log has the line…
    assert outputs.leaks() == []  # …without the query


def test_fragment_and_userinfo_on_the_wire_never_leave(outputs: Outputs) -> None:
    targets = (
        f"/echo#{CANARY}",
        f"/echo?a=1#{CANARY}",
        f"http://user:{CANARY}@127.0.0.1:{FRONT_PORT}/echo",
        f"http://{CANARY}@127.0.0.1:{FRONT_PORT}/echo?q={CANARY}#{CANARY}",
    )
    before = outputs.seen("/echo")
    for target in targets:
        head = f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{FRONT_PORT}\r\nConnection: close\r\n\r\n"
        reply = raw_request(FRONT_PORT, head.encode())
        outputs.replies.append((f"raw {target[:20]}", reply))
        assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
    outputs.wait_spans("/echo", before, len(targets))
    assert outputs.leaks() == []


def test_secret_headers_never_leave(outputs: Outputs) -> None:
    headers = {
        "Authorization": f"Bearer {CANARY}",
        "Proxy-Authorization": f"Basic {CANARY}",
        "Cookie": f"gym_obs_session={CANARY}; other={CANARY}",
        "X-Api-Key": CANARY,
        "X-NG-Session": CANARY,
        "User-Agent": f"bench/1.0 (token={CANARY})",
    }
    before = outputs.seen("/session")
    status, reply_headers, body = outputs.call(FRONT + "/session", headers=headers)
    assert status == 200, body
    assert CANARY not in reply_headers.get("X-NG-Session", "")  # a forged token is not adopted
    outputs.wait_spans("/session", before, 1)
    assert outputs.leaks() == []


def test_bodies_and_validation_errors_never_leave(outputs: Outputs) -> None:
    before = outputs.seen("/validated")
    status, _, _ = outputs.call(FRONT + "/echo", "POST", body=json.dumps({"prompt": CANARY}).encode())
    assert status == 200
    invalid = json.dumps({"count": CANARY, "note": CANARY, CANARY: CANARY}).encode()
    # FastAPI's 422 body echoes the caller's own input back to that caller: not an output to grep.
    status, _, _ = outputs.call(FRONT + "/validated", "POST", body=invalid, keep=False)
    assert status == 422
    outputs.wait_logged("request failed validation")
    outputs.wait_spans("/validated", before, 1)
    assert outputs.leaks() == []


def test_an_upstream_error_body_is_recorded_scrubbed(outputs: Outputs) -> None:
    before = outputs.seen("/upstream")
    status, _, body = outputs.call(FRONT + "/upstream", "POST", body=b"{}")
    assert status == 500
    assert UPSTREAM_PROBLEM in body.decode()  # what went wrong upstream is in the failure record…
    assert SECRET_TEXT not in body.decode()
    outputs.wait_spans("/upstream", before, 1)
    outputs.wait_logged(UPSTREAM_PROBLEM)  # …and in the log line
    assert outputs.leaks() == []  # …without the secret the body held


def test_config_secrets_are_never_served(outputs: Outputs) -> None:
    served: dict[str, Any] = {}
    for path in ("/global_config", "/global_config.yaml", "/server_instances"):
        status, _, data = outputs.call(HEAD + path)
        assert status == 200 and b"front" in data
        if path == "/global_config":
            served = json.loads(data)
    front = served["servers"]["front"]
    assert front["session_secret"] == "[REDACTED]" and front["api_key"] == "[REDACTED]"
    assert front["provider"] == {"openai_api_key": "[REDACTED]", "credentials": "[REDACTED]"}
    assert served["servers"]["peer"]["password"] == "[REDACTED]"
    assert front["port"] == FRONT_PORT and front["entrypoint"].endswith("CanaryFrontServer")
    assert outputs.leaks() == []


def test_nothing_leaked_once_everything_stopped(outputs: Outputs) -> None:
    outputs.running.stop()  # the shutdown flush exports the last spans and metrics
    logs = files_under(outputs.running.log_dir)
    assert len(logs) == 3 and all(b"Unclosed client session" not in data for _, data in logs)
    assert "/v1/metrics" in outputs.receiver.paths()  # metrics were exported, and are grepped too
    assert outputs.leaks() == []
