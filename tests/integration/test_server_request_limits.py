"""Denial of service and proxy trust on real launched servers (issue 12, items 9, 11, 12).

- 11: a 50 MB request header is refused with 431 after the configured head limit, the server's CPU time
  for the whole attack stays small (process CPU from /proc, not wall clock), and /livez answers meanwhile.
- 12: slow-loris connections (trickled heads, silent connections) are closed by the server; idle
  keep-alive connections are reaped.
- 9: X-Forwarded-For is honoured exactly when the connecting proxy is in the validated allow-list, and a
  list uvicorn would read differently (host bits) or that trusts everyone is refused before launch.

Ports: head 31500, limits server 31501, trusting server 31502, untrusting server 31503,
refused (never started) 31504-31505.
"""

from __future__ import annotations

import json
import os
import select
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from gym_obs.config import GlobalConfig, parse_global_config
from gym_obs.server.launcher import Launch, launch
from gym_obs.server.uvicorn import ServerStartupError
from tests.integration.otlp_receiver import LAUNCH_ENV

pytestmark = pytest.mark.integration

HEAD_PORT = 31500
LIMITS_PORT = 31501
TRUSTING_PORT = 31502
UNTRUSTING_PORT = 31503
APP = "tests.integration.upload_apps:UploadServer"
HEAD_TIMEOUT_S = 1.0
KEEP_ALIVE_S = 1
CLOSE_BOUND_S = 15.0  # generous: the server must close within its timeout; this only ends a hung test


def _server(port: int, **overrides: Any) -> dict[str, Any]:
    return {"entrypoint": APP, "server_type": "resources_servers", "port": port, **overrides}


def _config() -> GlobalConfig:
    return parse_global_config(
        {
            "head_server": {"port": HEAD_PORT},
            "servers": {
                "limits": _server(
                    LIMITS_PORT, http_head_timeout_s=HEAD_TIMEOUT_S, timeout_keep_alive_s=KEEP_ALIVE_S
                ),
                "trusting": _server(TRUSTING_PORT, proxy_headers=True, forwarded_allow_ips=["127.0.0.0/8"]),
                "untrusting": _server(
                    UNTRUSTING_PORT, proxy_headers=True, forwarded_allow_ips=["10.0.0.0/8"]
                ),
            },
        }
    )


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launch]:
    with launch(_config(), log_dir=tmp_path_factory.mktemp("logs"), env=LAUNCH_ENV) as running:
        yield running


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process (and its reaped children are not counted: uvicorn runs in-process)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=30) as response:
        return response.status, response.read()


def _read_until_closed(sock: socket.socket, bound_s: float = CLOSE_BOUND_S) -> bytes:
    """Everything the server sends until it closes the connection (or the test's bound runs out)."""
    sock.settimeout(bound_s)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    return received


# --- 11: huge request heads ---------------------------------------------------------------------------------


def _send_huge_header(port: int, total: int) -> tuple[bytes, int]:
    """Send a request whose one header is ``total`` bytes; stop when the server answers or closes.

    Returns what the server sent and how many header bytes it took."""
    chunk = b"a" * 65536
    sent = 0
    received = b""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\nX-Huge: ")
        try:
            while sent < total:
                readable, writable, _ = select.select([sock], [sock], [], 10)
                if readable:
                    break
                if writable:
                    sent += sock.send(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        received = _read_until_closed(sock)
    return received, sent


def test_a_huge_header_gets_431_cheaply_and_livez_stays_responsive(deployment: Launch) -> None:
    pid = deployment.servers["limits"].pid
    before = _cpu_seconds(pid)
    attacks = 6
    results: list[tuple[bytes, int]] = []

    def attack() -> None:
        for _ in range(attacks // 3):
            results.append(_send_huge_header(LIMITS_PORT, 50 * 1024 * 1024))

    attackers = [threading.Thread(target=attack) for _ in range(3)]
    for thread in attackers:
        thread.start()
    probes: list[int] = []
    while any(thread.is_alive() for thread in attackers) or not probes:
        probes.append(_get(LIMITS_PORT, "/livez")[0])
    for thread in attackers:
        thread.join()
    spent = _cpu_seconds(pid) - before

    assert len(results) == attacks
    for received, sent in results:
        assert received.startswith(b"HTTP/1.1 431 "), received[:200]
        assert b"connection: close" in received.lower()
        assert sent < 16 * 1024 * 1024  # refused long before the 50 MB were sent
    assert probes and set(probes) == {200}
    # Six 50 MB heads cost 2.3 s of CPU *each* before the limit; now the whole attack, probes included,
    # costs a small fraction of one.
    assert spent < 1.5, f"server spent {spent:.2f}s CPU on the attack"
    assert _get(LIMITS_PORT, "/livez")[0] == 200


def test_a_head_within_the_limit_is_served(deployment: Launch) -> None:
    status, _ = _get(LIMITS_PORT, "/livez", headers={"X-Big": "b" * 60_000})
    assert status == 200


# --- 12: slow loris and idle connections ----------------------------------------------------------------


def test_trickled_heads_are_closed_by_the_server(deployment: Launch) -> None:
    count = 40
    socks = [socket.create_connection(("127.0.0.1", LIMITS_PORT)) for _ in range(count)]
    closed: dict[int, bytes] = {}
    try:
        for sock in socks:
            sock.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n")
            sock.setblocking(False)
        started = time.monotonic()
        while len(closed) < count and time.monotonic() - started < CLOSE_BOUND_S:
            for index, sock in enumerate(socks):
                if index in closed:
                    continue
                try:
                    sock.send(b"X-a: b\r\n")  # one header line at a time, never the blank line
                    data = sock.recv(65536)
                except BlockingIOError:
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    data = b""
                closed[index] = data
            time.sleep(0.1)
    finally:
        for sock in socks:
            sock.close()
    assert len(closed) == count, f"{count - len(closed)} trickling connections were never closed"
    assert all(data == b"" or data.startswith(b"HTTP/1.1 408 ") for data in closed.values())
    assert any(data.startswith(b"HTTP/1.1 408 ") for data in closed.values())
    assert _get(LIMITS_PORT, "/livez")[0] == 200


def test_a_silent_connection_is_closed(deployment: Launch) -> None:
    with socket.create_connection(("127.0.0.1", LIMITS_PORT)) as sock:
        started = time.monotonic()
        assert _read_until_closed(sock) == b""
        assert time.monotonic() - started < CLOSE_BOUND_S  # closed by the server, not by the bound


def test_an_idle_keep_alive_connection_is_reaped(deployment: Launch) -> None:
    with socket.create_connection(("127.0.0.1", LIMITS_PORT)) as sock:
        sock.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        started = time.monotonic()
        received = _read_until_closed(sock)
        assert received.startswith(b"HTTP/1.1 200 ") and b"connection: close" not in received.lower()
        assert time.monotonic() - started < CLOSE_BOUND_S


# --- 9: proxy trust ---------------------------------------------------------------------------------------


def test_forwarded_for_is_honoured_exactly_from_trusted_proxies(deployment: Launch) -> None:
    forwarded = {"X-Forwarded-For": "203.0.113.7"}

    trusted = json.loads(_get(TRUSTING_PORT, "/client", forwarded)[1])
    assert trusted["host"] == "203.0.113.7"  # 127.0.0.1 is in 127.0.0.0/8: the proxy is trusted
    untrusted = json.loads(_get(UNTRUSTING_PORT, "/client", forwarded)[1])
    assert untrusted["host"] == "127.0.0.1"  # not in 10.0.0.0/8: the header is a client's claim
    plain = json.loads(_get(LIMITS_PORT, "/client", forwarded)[1])
    assert plain["host"] == "127.0.0.1"  # proxy headers off


@pytest.mark.parametrize(
    ("entries", "reason"),
    [
        (["127.0.0.1/8"], "has host bits set"),
        (["0.0.0.0/1", "128.0.0.0/1"], "together cover every IPv4 address"),
        (["::ffff:0:0/97", "::ffff:128.0.0.0/97"], "together cover every IPv4 address"),
    ],
)
def test_lists_uvicorn_would_misread_or_that_trust_everyone_are_refused_before_launch(
    entries: list[str], reason: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    config = parse_global_config(
        {
            "head_server": {"port": HEAD_PORT + 4},
            "servers": {"bad": _server(HEAD_PORT + 4 + 1, proxy_headers=True, forwarded_allow_ips=entries)},
        }
    )
    with pytest.raises(ServerStartupError) as caught, launch(config, log_dir=tmp_path_factory.mktemp("bad")):
        pass
    assert str(caught.value).startswith("servers.bad.forwarded_allow_ips: entr")
    assert reason in str(caught.value)
