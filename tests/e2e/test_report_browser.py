"""The HTML report of a real harness run, opened in a real browser (Debian's headless ``chromium``).

A real run with faults writes its folder; a hostile peer's failure (``<script>`` in its reason, ids and span
names) is appended to it; ``gym-obs report`` writes the page; Chromium loads it from disk and is driven over
the DevTools protocol (aiohttp's websocket client): no console error or exception, our script ran and the
planted one did not, every section is there, each waterfall has exactly the spans of its trace in the
telemetry files, a click shows a span's attributes. A full-page PNG is kept in the test's tmp dir.
``gym-obs explain`` is checked against the same run.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gym_obs.harness.report.page import SECTION_IDS

PORT_BASE = 32500
DEVTOOLS_PORT = 32600
HOSTILE = '</script><script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'
HOSTILE_TRACE = "fe" * 16
FAULTS = """\
faults:
  - {server: resources, route: /verify, rate: 0.2, action: raise, exception: ZeroDivisionError}
  - {server: model, route: /v1/responses, rate: 0.1, action: disconnect}
  - {server: model, route: /v1/responses, rate: 0.05, action: status, status: 503}
"""


def _cli(*args: str, timeout: float = 110) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gym_obs.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def _hostile_row() -> dict[str, Any]:
    final, root = "fe_" + "a" * 24, "fe_" + "b" * 24
    return {
        "rollout_id": f"peer-{HOSTILE}",
        "index": 99999,
        "trace_id": HOSTILE_TRACE,
        "outcome": "failed",
        "duration_s": 0.01,
        "started_at": None,
        "error": HOSTILE,
        "_ng_failure_events": {
            final: {
                "event_id": final,
                "failure_kind": "model_error",
                "failure_reason": HOSTILE,
                "boundary": "model",
                "stage": "agent",
                "http_status": 502,
                "cause_id": root,
                "server_name": "agent_0",
            },
            root: {
                "event_id": root,
                "failure_kind": None,
                "exception_type": "ValueError",
                "failure_reason": HOSTILE,
            },
        },
        "_ng_failure_id": final,
    }


def _hostile_spans_line() -> str:
    def attrs(**values: str) -> list[dict[str, Any]]:
        return [{"key": k.replace("_", "."), "value": {"stringValue": v}} for k, v in values.items()]

    spans = [
        {
            "traceId": HOSTILE_TRACE,
            "spanId": "1" * 16,
            "name": f"gym.rollout {HOSTILE}",
            "kind": 1,
            "startTimeUnixNano": "1800000000000000000",
            "endTimeUnixNano": "1800000000010000000",
            "attributes": attrs(gym_rollout_id=HOSTILE),
            "status": {"code": 2, "message": HOSTILE},
        },
        {
            "traceId": HOSTILE_TRACE,
            "spanId": "2" * 16,
            "parentSpanId": "1" * 16,
            "name": "POST /v1/responses",
            "kind": 3,
            "startTimeUnixNano": "1800000000001000000",
            "endTimeUnixNano": "1800000000009000000",
            "attributes": attrs(gym_server_name=HOSTILE),
            "events": [
                {
                    "name": "gym.http.attempt_failed",
                    "timeUnixNano": "1800000000005000000",
                    "attributes": attrs(error_type=HOSTILE),
                }
            ],
        },
    ]
    resource = {"attributes": attrs(service_name=f"gym/{HOSTILE}")}
    return json.dumps({"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": spans}]}]})


@dataclass
class Run:
    out: Path
    report: Path
    rows: list[dict[str, Any]]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    base = tmp_path_factory.mktemp("report-run")
    (base / "faults.yaml").write_text(FAULTS)
    out = base / "out"
    result = _cli(
        "harness",
        "run",
        "--out",
        str(out),
        "--rollouts",
        "120",
        "--faults",
        str(base / "faults.yaml"),
        "--port-base",
        str(PORT_BASE),
        "--seed",
        "7",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    with (out / "latest" / "rollouts.jsonl").open("a") as rows:
        rows.write(json.dumps(_hostile_row()) + "\n")
    with (out / "latest" / "telemetry" / "gym_peer-1.traces.jsonl").open("w") as traces:
        traces.write(_hostile_spans_line() + "\n")
    report = _cli("report", str(out))
    assert report.returncode == 0, report.stderr
    rows_text = (out / "latest" / "rollouts.jsonl").read_text()
    rows_read = [json.loads(line) for line in rows_text.splitlines()]
    return Run(out=out, report=Path(report.stdout.strip()), rows=rows_read)


def _spans_by_trace(telemetry: Path, kind: int | None = None) -> dict[str, list[str]]:
    """Independently of the report code: span names per trace id (of one kind), from every process's file."""
    out: dict[str, list[str]] = {}
    for path in telemetry.glob("*.traces.jsonl"):
        for line in path.read_text().splitlines():
            for rs in json.loads(line)["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for span in ss["spans"]:
                        if kind is not None and span.get("kind") != kind:
                            continue
                        out.setdefault(span["traceId"], []).append(span["name"])
    return out


class DevTools:
    """The few DevTools-protocol calls the test needs, with every event kept for the assertions."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self._next = 0

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._next += 1
        await self.ws.send_json({"id": self._next, "method": method, "params": params})
        while True:
            message = await self.ws.receive_json(timeout=60)
            if message.get("id") == self._next:
                assert "error" not in message, message
                result: dict[str, Any] = message.get("result", {})
                return result
            self.events.append(message)

    async def until(self, event: str) -> None:
        while not any(e.get("method") == event for e in self.events):
            self.events.append(await self.ws.receive_json(timeout=60))

    async def js(self, expression: str) -> Any:
        reply = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in reply, reply
        return reply["result"].get("value")


@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = shutil.which("chromium")
    assert binary, "chromium is missing: apt-get install -y chromium (scripts/test.sh installs it)"
    profile = tmp_path_factory.mktemp("chromium-profile")
    proc = subprocess.Popen(
        [
            binary,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--hide-scrollbars",
            f"--remote-debugging-port={DEVTOOLS_PORT}",
            "--remote-debugging-address=127.0.0.1",
            f"--user-data-dir={profile}",
            "--window-size=1400,1000",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield f"http://127.0.0.1:{DEVTOOLS_PORT}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _page_ws(session: aiohttp.ClientSession, devtools: str) -> str:
    for _ in range(300):  # chromium takes a moment to open its DevTools port
        try:
            async with session.get(f"{devtools}/json/list") as reply:
                pages = [t for t in await reply.json() if t.get("type") == "page"]
            if pages:
                return str(pages[0]["webSocketDebuggerUrl"])
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    raise AssertionError("chromium's DevTools endpoint never answered")


@dataclass
class Loaded:
    events: list[dict[str, Any]]
    checks: dict[str, Any]
    detail: str
    png: bytes


_CHECKS = """(() => {
  const traces = [...document.querySelectorAll('.trace')].map(t => ({
    id: t.id, declared: Number(t.dataset.spans),
    names: JSON.parse(t.querySelector('script.span-data').textContent).map(s => s.name),
    rows: t.querySelectorAll('.span-row').length,
    attempts: t.querySelectorAll('.ev-attempt').length}));
  return {ready: document.body.dataset.reportReady,
          pwned: window.__pwned === undefined ? null : window.__pwned,
          sections: [...document.querySelectorAll('main > section')].map(s => s.id),
          imgs: document.querySelectorAll('img').length, scripts: document.querySelectorAll('script').length,
          json_scripts: document.querySelectorAll('script[type="application/json"]').length,
          trees: document.querySelectorAll('#failures .cause-tree').length,
          skipped: document.getElementById('skipped').textContent, traces};
})()"""


async def _load(devtools: str, page: Path) -> Loaded:
    async with aiohttp.ClientSession() as session:
        ws_url = await _page_ws(session, devtools)
        async with session.ws_connect(ws_url, max_msg_size=0) as ws:
            tools = DevTools(ws)
            for domain in ("Runtime", "Log", "Page"):
                await tools.call(f"{domain}.enable")
            await tools.call("Page.navigate", url=page.as_uri())
            await tools.until("Page.loadEventFired")
            checks = await tools.js(_CHECKS)
            # a real click, at the first span bar of the first waterfall
            box = await tools.js(
                "(() => { const r = document.querySelector('.trace .span-bar').getBoundingClientRect();"
                " window.scrollTo(0, 0); const q = document.querySelector('.trace .span-bar');"
                " q.scrollIntoView({block: 'center'}); const b = q.getBoundingClientRect();"
                " return [b.x + b.width / 2, b.y + b.height / 2, r.width]; })()"
            )
            for kind in ("mousePressed", "mouseReleased"):
                await tools.call(
                    "Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1
                )
            detail = await tools.js("document.querySelector('.trace .span-detail').textContent")
            await tools.js("window.scrollTo(0, 0)")
            shot = await tools.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
            return Loaded(tools.events, checks, str(detail), base64.b64decode(shot["data"]))


@pytest.fixture(scope="module")
def loaded(run: Run, chromium: str, tmp_path_factory: pytest.TempPathFactory) -> Loaded:
    result = asyncio.run(_load(chromium, run.report))
    artifact = tmp_path_factory.mktemp("report-artifacts") / "report.png"
    artifact.write_bytes(result.png)
    return result


def test_browser_reports_no_console_error_or_exception(loaded: Loaded) -> None:
    problems = [
        e
        for e in loaded.events
        if e.get("method") == "Runtime.exceptionThrown"
        or (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert"))
        or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")
    ]
    assert problems == []
    assert loaded.checks["ready"] == "1"  # the page's own script ran to the end


def test_planted_script_is_inert(loaded: Loaded, run: Run) -> None:
    assert loaded.checks["pwned"] is None
    assert loaded.checks["imgs"] == 0
    assert loaded.checks["scripts"] == 1 + loaded.checks["json_scripts"]
    # the hostile peer's failure is on the page, as text
    assert HOSTILE in run.report.read_text().replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"')


def test_every_section_is_present(loaded: Loaded) -> None:
    assert loaded.checks["sections"] == list(SECTION_IDS)
    assert loaded.checks["trees"] >= 2  # verifier_error and provider_unavailable at least
    assert "skipped lines: 0" in loaded.checks["skipped"]


def test_each_waterfall_has_the_spans_of_its_trace(loaded: Loaded, run: Run) -> None:
    by_trace = _spans_by_trace(run.out / "latest" / "telemetry")
    traces = loaded.checks["traces"]
    assert len(traces) >= 5
    for trace in traces:
        trace_id = trace["id"].removeprefix("trace-")
        expected = by_trace[trace_id]
        assert trace["rows"] == trace["declared"] == len(expected)
        assert sorted(trace["names"]) == sorted(expected)
    assert any(t["attempts"] for t in traces), "no failed attempt marked in any waterfall"
    assert f"trace-{HOSTILE_TRACE}" in {t["id"] for t in traces}


def test_clicking_a_span_shows_its_attributes(loaded: Loaded) -> None:
    assert "span_id" in loaded.detail
    assert "gym.rollout.id" in loaded.detail or "gym.server.name" in loaded.detail


def test_screenshot_is_a_png(loaded: Loaded) -> None:
    assert loaded.png.startswith(b"\x89PNG\r\n\x1a\n") and len(loaded.png) > 50_000


def test_explain_tells_the_story_of_a_failed_rollout(run: Run) -> None:
    row = next(
        r for r in run.rows if r["outcome"] == "failed" and r["root_cause"]["kind"] == "verifier_error"
    )
    result = _cli("explain", row["rollout_id"], str(run.out), "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    events = row["_ng_failure_events"]
    expected = []
    event_id: str | None = row["_ng_failure_id"]
    while event_id is not None:
        expected.append(events[event_id].get("failure_kind") or events[event_id]["exception_type"])
        event_id = events[event_id].get("cause_id")
    assert [link["kind"] or link["exception_type"] for link in doc["failure_chain"]] == expected
    assert expected[-1] == "ZeroDivisionError"
    clients = _spans_by_trace(run.out / "latest" / "telemetry", kind=3)[row["trace_id"]]  # CLIENT spans
    assert sorted(h["name"] for h in doc["hops"]) == sorted(clients)
    assert {h["destination"] for h in doc["hops"]} == {"agent_0", "model_0", "resources_0"}
    assert doc["report"] == f"{run.report}#trace-{row['trace_id']}" and doc["report_exists"]
    text = _cli("explain", row["trace_id"], str(run.out))
    assert text.returncode == 0 and "verifier_error  boundary=resources_server" in text.stdout


def test_explain_unknown_id_counts_the_rollouts(run: Run) -> None:
    result = _cli("explain", "no-such-rollout", str(run.out))
    assert result.returncode == 2
    assert result.stderr.strip().endswith(f"(it has {len(run.rows)} rollouts)")
