"""Servers for the canary suite: every route takes hostile input or crafts a hostile reply.

Imported by launched child processes through their ``entrypoint`` (``tests.security.canary_apps:...``), so
everything here works in a fresh process with only the global config.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel

from gym_obs import raise_boundary_failure, raise_for_status, request
from gym_obs.failures.event import NgFailureEvent
from gym_obs.failures.report import FailureReport
from gym_obs.failures.transport import FAILURE_REPORT_BODY_KEY, FAILURE_REPORT_HEADER, encode_failure_report
from gym_obs.server import SimpleServer
from gym_obs.telemetry.logging import get_logger

CANARY: Final = "kanarie7f3a9c2e51d04b86e"
"""The one planted secret. Plain (no ``sk-`` prefix), so only the structural rules can remove it: a query,
fragment or userinfo is never recorded, a secret-looking key's value never is, bodies never are."""

SECRET_TEXT: Final = f"password={CANARY}"
"""The canary as a secret in free text (an exception message, an upstream's error body)."""

UPSTREAM_PROBLEM: Final = "CUDA out of memory on device 3"
"""What the upstream's error body says went wrong: must reach the outer server's record and log."""

_log = get_logger("tests.canary_apps")


class Item(BaseModel):
    count: int
    note: str


def _peer_url(server: SimpleServer, path: str) -> str:
    return server.server_client.url("peer", path)


def hostile_report(http_status: int | None = 500, *, valid_kind: bool = False) -> FailureReport:
    """A report with the canary in every string field a peer controls (ids stay well-formed); with
    ``valid_kind`` the final failure's kind is a real one, so only the other fields are hostile."""
    final = NgFailureEvent("internal_error", "x", boundary="model", http_status=http_status).to_record()
    cause = NgFailureEvent("internal_error", "y", boundary="model").to_record()
    foreign: dict[str, Any] = {
        "event_id": "fe_" + "c" * 24,
        "failure_kind": None,
        "exception_type": f"api_key={CANARY}",
        "failure_reason": f"token={CANARY} \x1b[2J",
        "cause_id": None,
        "details": {"api_key": CANARY, "nested": {"password": CANARY}},
    }
    final.update(
        failure_kind="internal_error" if valid_kind else f"token={CANARY}",
        failure_reason=f"{SECRET_TEXT} \x1b[2J",
        stage=f"secret={CANARY}",
        rollout_id=f"token={CANARY}",
        server_name=f"token={CANARY}",
        details={"api_key": CANARY, "Authorization": f"Bearer {CANARY}", "ok": f"token={CANARY}"},
        cause_id=cause["event_id"],
    )
    cause.update(failure_reason=f"secret={CANARY}", cause_id=foreign["event_id"], details={"token": CANARY})
    events = {record["event_id"]: record for record in (final, cause, foreign)}
    return FailureReport.model_construct(
        failure_id=final["event_id"], events=events, truncated=False, dropped=0
    )


class CanaryPeerServer(SimpleServer):
    """The upstream (``responses_api_models``): error bodies, hostile failure reports, lying statuses."""

    def setup_webserver(self) -> FastAPI:
        app = FastAPI()

        @app.post("/explain")
        async def explain() -> PlainTextResponse:
            return PlainTextResponse(f"{UPSTREAM_PROBLEM} ({SECRET_TEXT})", status_code=500)

        @app.post("/hostile_report/{variant}")
        async def hostile(variant: str) -> Response:
            report = hostile_report(valid_kind=variant == "valid_kind")
            header = encode_failure_report(report)
            body = {"detail": f"token={CANARY}", FAILURE_REPORT_BODY_KEY: report.to_payload()}
            return JSONResponse(body, status_code=500, headers={FAILURE_REPORT_HEADER: header})

        @app.post("/lying_report/{status}")
        async def lying_report(status: int) -> Response:
            """A hostile peer: answers 500 with a report whose failure claims ``status`` (200, 204)."""
            claim = NgFailureEvent("provider_unavailable", "claims success", boundary="model")
            claim.http_status = status
            events = {claim.event_id: dict(claim.to_record())}
            report = FailureReport(failure_id=claim.event_id, events=events)
            return JSONResponse(
                {"detail": "failed", FAILURE_REPORT_BODY_KEY: report.to_payload()},
                status_code=500,
                headers={FAILURE_REPORT_HEADER: encode_failure_report(report)},
            )

        @app.post("/report_status/{status}")
        async def report_status(status: int) -> Response:
            """A peer whose failure report claims ``status`` (200, 204) for a failure."""
            raise NgFailureEvent("provider_unavailable", "lying peer", boundary="model", http_status=status)

        return app


class CanaryFrontServer(SimpleServer):
    """The server under attack (``responses_api_agents``)."""

    def setup_webserver(self) -> FastAPI:
        app = FastAPI()

        @app.api_route("/echo", methods=["GET", "POST"])
        async def echo(request: Request) -> dict[str, Any]:
            # The handler still sees its query (only telemetry is kept from it); the reply says so without
            # echoing it, so the replies stay clean outputs to grep.
            return {"query_sha256": hashlib.sha256(request.url.query.encode()).hexdigest()}

        @app.post("/boom")
        async def boom() -> None:
            raise ValueError(f"database unreachable ({SECRET_TEXT})")

        @app.post("/validated")
        async def validated(item: Item) -> dict[str, Any]:
            return {"count": item.count}

        @app.post("/upstream")
        async def upstream() -> None:
            await raise_for_status(await request("POST", _peer_url(self, "/explain")))

        @app.post("/peer_report/{variant}")
        async def peer_report(variant: str) -> None:
            await raise_boundary_failure(await request("POST", _peer_url(self, f"/hostile_report/{variant}")))

        @app.post("/peer_status/{status}")
        async def peer_status(status: int) -> dict[str, Any]:
            await raise_boundary_failure(await request("POST", _peer_url(self, f"/report_status/{status}")))
            return {"returned": "normally"}

        @app.post("/lying_peer/{status}")
        async def lying_peer(status: int) -> dict[str, Any]:
            await raise_boundary_failure(await request("POST", _peer_url(self, f"/lying_report/{status}")))
            return {"returned": "normally"}

        @app.get("/session")
        async def session(request: Request) -> dict[str, Any]:
            return {"session_id": request.session["session_id"]}

        return app
