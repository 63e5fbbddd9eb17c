"""One failure hop through a real gym server and the harness driver: the reply, and the row it becomes.

A ``SimpleServer`` agent under uvicorn (ports 13600-13601) recovers from one failure, then fails: its failure
reply must carry both (body and header, the new session's token on it too), and the harness row of the
failed rollout must keep the recovered event beside the final chain (it once kept only the chain).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request

from gym_obs import ServerClient
from gym_obs.client.http_client import close_global_aiohttp_client
from gym_obs.config import GlobalConfig, parse_global_config
from gym_obs.failures import (
    FAILURE_REPORT_BODY_KEY,
    FAILURE_REPORT_HEADER,
    FailureReport,
    NgFailureEvent,
    decode_failure_report,
    observe_failure,
    read_report_from_row,
)
from gym_obs.harness.driver import Driver
from gym_obs.server import SESSION_ID_KEY, SimpleServer
from gym_obs.telemetry import names

pytestmark = pytest.mark.integration

PORT = 13600
HEAD_PORT = 13601


class RecoverThenFailAgent(SimpleServer):
    """``POST /run``: a model attempt failed and was retried (recovered), then verification crashed."""

    def setup_webserver(self) -> FastAPI:
        app = FastAPI()

        @app.post("/run")
        async def run(request: Request) -> dict[str, Any]:
            if request.query_params.get("session"):
                _ = request.session[SESSION_ID_KEY]  # issues a session: its token rides on the failure reply
            recovered = NgFailureEvent("transport_peer_drop", "attempt 1 dropped; retrying", boundary="model")
            recovered.__cause__ = ConnectionResetError("peer dropped the connection")
            observe_failure(recovered)
            try:
                _ = 1 / 0
            except ZeroDivisionError as zde:
                raise NgFailureEvent(
                    "verifier_error",
                    "verification crashed",
                    boundary="resources_server",
                    stage="verification",
                    http_status=500,
                ) from zde
            return {}

        return app


def _config() -> GlobalConfig:
    entry = {"entrypoint": f"{__name__}:RecoverThenFailAgent", "server_type": "responses_api_agents"}
    return parse_global_config(
        {"head_server": {"port": HEAD_PORT}, "servers": {"agent": {**entry, "port": PORT}}}
    )


@contextlib.contextmanager
def _uvicorn(app: Any) -> Iterator[str]:
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=PORT, log_level="warning", lifespan="on", log_config=None)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{PORT}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def agent() -> Iterator[str]:
    with _uvicorn(RecoverThenFailAgent("agent", _config()).build_app()) as url:
        yield url


def _chain(report: FailureReport) -> list[str]:
    """Event ids from the final failure down its causes."""
    chain: list[str] = []
    node = report.failure_id
    while node is not None and node not in chain:
        chain.append(node)
        node = report.events[node]["cause_id"]
    return chain


def _kinds(report: FailureReport) -> list[str | None]:
    return [record["failure_kind"] for record in report.events.values()]


async def test_the_failure_reply_reports_the_final_chain_and_the_recovered_failure(agent: str) -> None:
    async with httpx.AsyncClient(base_url=agent) as http:
        reply = await http.post("/run", params={"session": "1"})
    assert reply.status_code == 500
    body = FailureReport.from_payload(reply.json()[FAILURE_REPORT_BODY_KEY])
    header = decode_failure_report(reply.headers[FAILURE_REPORT_HEADER])
    for report in (body, header):
        assert report.failure_id is not None
        chain = _chain(report)
        assert [report.events[eid]["failure_kind"] for eid in chain] == ["verifier_error", None]
        assert report.events[chain[-1]]["exception_type"] == "ZeroDivisionError"
        assert _kinds(report).count("transport_peer_drop") == 1  # the recovered failure, beside the chain
    assert header.events.keys() == body.events.keys()  # one report, in both places
    assert len(reply.headers.get_list(FAILURE_REPORT_HEADER)) == 1
    # the session issued during the failed request is handed back on the failure reply
    assert reply.headers[names.SESSION_HEADER]
    assert reply.cookies.get(names.SESSION_COOKIE)


async def test_a_failed_rollout_row_keeps_the_failures_the_agent_recovered_from(agent: str) -> None:
    driver = Driver(client=ServerClient(_config()), agents=["agent"], run_id="hop", rollout_timeout_s=20)
    try:
        result = await driver.rollout(0)
    finally:
        await close_global_aiohttp_client()
    row = result.row()
    assert row["outcome"] == names.ROLLOUT_OUTCOME_FAILED
    assert row["root_cause"]["kind"] == "verifier_error"
    assert row["root_cause"]["foreign_cause"] == "ZeroDivisionError"
    report = read_report_from_row(row)
    assert report is not None and report.failure_id == row["_ng_failure_id"]
    assert report.events[report.failure_id]["failure_kind"] == "verifier_error"
    recovered = [r for r in report.events.values() if r["failure_kind"] == "transport_peer_drop"]
    assert len(recovered) == 1 and recovered[0]["boundary"] == "model"
    cause = report.events[recovered[0]["cause_id"]]
    assert cause["exception_type"] == "ConnectionResetError"
    assert "recovered_failures" not in row  # a failed rollout counts no recovered failures
