"""What the canary tests share: a receiver that keeps every OTLP export raw, launching, and the grep.

The grep is deliberately dumb: a planted secret is searched as bytes in every file a deployment wrote and
every export body the receiver got (protobuf strings are stored as plain UTF-8), so no decoding step can
hide an occurrence.
"""

from __future__ import annotations

import base64
import gzip
import socket
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from gym_obs.config import GlobalConfig, parse_global_config
from gym_obs.server.launcher import Launch
from tests.integration.otlp_receiver import LAUNCH_ENV, SPAN_KIND_SERVER, OtlpReceiver, ReceivedSpan
from tests.security.canary_apps import CANARY

APPS = "tests.security.canary_apps"


class RawOtlpReceiver(OtlpReceiver):
    """An ``OtlpReceiver`` that also keeps the raw body of every export (traces, metrics and logs)."""

    def __init__(self, port: int) -> None:
        super().__init__(port)
        self.raw: list[tuple[str, bytes]] = []

    @staticmethod
    async def _body(request: web.Request) -> bytes:
        body = await request.read()
        return gzip.decompress(body) if request.headers.get("Content-Encoding") == "gzip" else body

    def _keep(self, path: str, body: bytes) -> None:
        with self._lock:  # never held across an await: the handlers share the receiver's loop
            self.raw.append((path, body))

    async def _traces(self, request: web.Request) -> web.Response:
        self._keep(request.path, await self._body(request))
        return await super()._traces(request)

    async def _ignore(self, request: web.Request) -> web.Response:
        self._keep(request.path, await self._body(request))
        return await super()._ignore(request)

    async def _metrics(self, request: web.Request) -> web.Response:
        self._keep(request.path, await self._body(request))
        return await super()._metrics(request)

    def bodies(self) -> list[tuple[str, bytes]]:
        with self._lock:
            return list(self.raw)

    def paths(self) -> set[str]:
        return {path for path, _ in self.bodies()}


def telemetry_section(receiver_port: int, file_dir: Path) -> dict[str, Any]:
    """Spans and metrics to the OTLP receiver AND to the file sink, metrics exported every 200 ms."""
    return {
        "enabled": True,
        "traces_exporter": "otlp,file",
        "metrics_exporter": "otlp,file",
        "otlp_endpoint": f"http://127.0.0.1:{receiver_port}",
        "otlp_protocol": "http/protobuf",
        "metric_export_interval_ms": 200,
        "file_export_dir": str(file_dir),
    }


def launch_env(**extra: str) -> dict[str, str]:
    """The launch environment of the integration tests (fast span export, JSON logs)."""
    return {**LAUNCH_ENV, **extra}


def occurrences(needle: str, blobs: Iterable[tuple[str, bytes]], context: int = 60) -> list[str]:
    """``where: …excerpt…`` for every occurrence of ``needle`` in the named blobs (empty when clean)."""
    target = needle.encode()
    found: list[str] = []
    for where, data in blobs:
        start = data.find(target)
        while start != -1:
            excerpt = data[max(0, start - context) : start + len(target) + context]
            found.append(f"{where}: {excerpt!r}")
            start = data.find(target, start + 1)
    return found


def files_under(*roots: Path) -> list[tuple[str, bytes]]:
    """Every file below ``roots`` as (path, bytes)."""
    blobs: list[tuple[str, bytes]] = []
    for root in roots:
        if root.is_file():
            blobs.append((str(root), root.read_bytes()))
            continue
        for path in sorted(root.rglob("*")):
            if path.is_file():
                blobs.append((str(path), path.read_bytes()))
    return blobs


def decoded_report_header(value: str) -> bytes:
    """The raw JSON inside an ``X-NG-Failure-Report`` value (``v1.`` + base64url(zlib(JSON)))."""
    if not value.startswith("v1."):
        return value.encode()
    data = value[3:]
    return zlib.decompress(base64.urlsafe_b64decode(data + "=" * (-len(data) % 4)))


def reply_blobs(
    label: str, status_line: str, headers: Mapping[str, str], body: bytes
) -> list[tuple[str, bytes]]:
    """A reply as blobs to grep: headers (failure header decoded too) and body."""
    blobs = [(f"{label} status", status_line.encode()), (f"{label} body", body)]
    for name, value in headers.items():
        blobs.append((f"{label} header {name}", value.encode("latin-1", "replace")))
        if name.lower() == "x-ng-failure-report":
            blobs.append((f"{label} decoded failure header", decoded_report_header(value)))
    return blobs


def raw_request(port: int, head: bytes, body: bytes = b"", timeout_s: float = 10.0) -> bytes:
    """Send a hand-written request (anything a hostile client can put on the wire); the whole reply."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(head + body)
        chunks: list[bytes] = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


# --- a deployment under attack ----------------------------------------------------------------------------


def canary_config(
    head_port: int, front_port: int, peer_port: int, receiver_port: int, file_dir: Path
) -> GlobalConfig:
    """front (the server under attack) and peer (its upstream), with the canary in every config secret."""
    return parse_global_config(
        {
            "head_server": {"port": head_port},
            "telemetry": telemetry_section(receiver_port, file_dir),
            "servers": {
                "front": {
                    "entrypoint": f"{APPS}:CanaryFrontServer",
                    "server_type": "responses_api_agents",
                    "port": front_port,
                    "access_log": True,
                    "session_secret": CANARY,
                    "api_key": CANARY,
                    "provider": {"openai_api_key": CANARY, "credentials": {"token": CANARY}},
                },
                "peer": {
                    "entrypoint": f"{APPS}:CanaryPeerServer",
                    "server_type": "responses_api_models",
                    "port": peer_port,
                    "access_log": True,
                    "password": CANARY,
                },
            },
        }
    )


class Outputs:
    """Everything a deployment produced so far, to grep; the tests add the replies they got."""

    def __init__(self, running: Launch, receiver: RawOtlpReceiver, file_dir: Path) -> None:
        self.running = running
        self.receiver = receiver
        self.file_dir = file_dir
        self.replies: list[tuple[str, bytes]] = []

    def blobs(self) -> list[tuple[str, bytes]]:
        otlp = [(f"otlp {path}", body) for path, body in self.receiver.bodies()]
        return [*otlp, *files_under(self.file_dir, self.running.log_dir), *self.replies]

    def leaks(self) -> list[str]:
        return occurrences(CANARY, self.blobs())

    def call(
        self,
        url: str,
        method: str = "GET",
        *,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        keep: bool = True,
    ) -> tuple[int, dict[str, str], bytes]:
        """One request (no proxies); the reply is kept as an output to grep unless ``keep=False``."""
        request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
        if body is not None:
            request.add_header("Content-Type", "application/json")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=10) as response:
                status, reply_headers, data = response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            status, reply_headers, data = error.code, dict(error.headers), error.read()
        if keep:
            self.replies.extend(reply_blobs(f"{method} {url[:60]}", str(status), reply_headers, data))
        return status, reply_headers, data

    def seen(self, route: str) -> int:
        """How many SERVER spans of ``route`` the receiver has."""
        return len(route_spans(self.receiver.spans(), route))

    def wait_spans(self, route: str, before: int, count: int) -> list[ReceivedSpan]:
        """The SERVER spans of ``route`` once ``count`` more than ``before`` have arrived."""
        spans = self.receiver.wait_for(lambda spans: len(route_spans(spans, route)) >= before + count)
        return route_spans(spans, route)

    def wait_logged(self, text: str, timeout_s: float = 15.0) -> None:
        """Wait until some process's log contains ``text``."""
        files_have(self.running.log_dir, text, timeout_s)


def route_spans(spans: list[ReceivedSpan], route: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.kind == SPAN_KIND_SERVER and s.name.endswith(" " + route)]


def files_have(directory: Path, text: str, timeout_s: float = 15.0) -> None:
    """Wait until some file below ``directory`` contains ``text`` (the file sink and logs are async)."""
    deadline = time.monotonic() + timeout_s
    while not any(text.encode() in data for _, data in files_under(directory)):
        assert time.monotonic() < deadline, f"{text!r} never appeared under {directory}"
        time.sleep(0.05)
