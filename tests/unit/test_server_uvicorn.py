"""uvicorn glue: proxy allow-list rules, worker refusal, listen sockets, TCP keepalive on accepted sockets."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import pytest

from gym_obs.config import GlobalAIOHTTPAsyncClientConfig, ServerInstanceConfig
from gym_obs.server.uvicorn import (
    KeepaliveHttpToolsProtocol,
    ServerStartupError,
    bind_listen_socket,
    build_uvicorn_config,
    check_worker_count,
    validate_forwarded_allow_ips,
)


def _instance(**overrides: Any) -> ServerInstanceConfig:
    return ServerInstanceConfig(entrypoint="a.b:C", server_type="resources_servers", port=24500, **overrides)


@pytest.mark.parametrize(
    "entries", [["10.0.0.5"], ["10.0.0.0/8", "192.168.1.1"], ["::1"], ["fd00::/8"], ["::ffff:10.0.0.1/128"]]
)
def test_explicit_proxy_lists_are_accepted(entries: list[str]) -> None:
    assert validate_forwarded_allow_ips(entries, proxy_headers=True) == entries


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ("*", "would trust every client"),
        ("0.0.0.0/0", "is a /0 network"),
        ("::/0", "is a /0 network"),
        ("::ffff:0:0/96", "covers every IPv4-mapped IPv6 address"),
        ("::/64", "covers every IPv4-mapped IPv6 address"),
        ("::ffff:0:0/95", "covers every IPv4-mapped IPv6 address"),
        ("proxy.internal", "is not an IP address or network"),
        ("10.0.0.300", "is not an IP address or network"),
    ],
)
def test_wildcards_and_garbage_are_refused_with_the_entry_named(entry: str, reason: str) -> None:
    with pytest.raises(ServerStartupError) as caught:
        validate_forwarded_allow_ips(
            ["10.0.0.1", entry], proxy_headers=True, where="servers.m.forwarded_allow_ips"
        )
    assert str(caught.value).startswith("servers.m.forwarded_allow_ips: entry ")
    assert repr(entry) in str(caught.value) and reason in str(caught.value)


def test_proxy_headers_need_a_non_empty_list_and_are_off_by_default() -> None:
    for entries in (None, []):
        with pytest.raises(ServerStartupError, match="non-empty list of trusted proxy addresses"):
            validate_forwarded_allow_ips(entries, proxy_headers=True)
    assert validate_forwarded_allow_ips(["*"], proxy_headers=False) == []  # unused while headers are off
    config = build_uvicorn_config(object(), _instance(), GlobalAIOHTTPAsyncClientConfig(), where="servers.m")
    assert config.proxy_headers is False  # uvicorn's own default is True
    on = build_uvicorn_config(
        object(),
        _instance(proxy_headers=True, forwarded_allow_ips=["10.1.2.3"]),
        GlobalAIOHTTPAsyncClientConfig(),
        where="servers.m",
    )
    assert on.proxy_headers is True and on.forwarded_allow_ips == ["10.1.2.3"]


def test_uvicorn_config_uses_the_server_entry() -> None:
    client = GlobalAIOHTTPAsyncClientConfig(
        global_aiohttp_tcp_keepalive_idle_seconds=30,
        global_aiohttp_tcp_keepalive_interval_seconds=5,
        global_aiohttp_tcp_keepalive_probes=4,
    )
    config = build_uvicorn_config(
        object(), _instance(backlog=77, timeout_keep_alive_s=90, num_workers=3), client, where="servers.m"
    )
    assert config.http is KeepaliveHttpToolsProtocol
    assert (config.backlog, config.timeout_keep_alive, config.workers, config.server_header) == (
        77,
        90,
        3,
        False,
    )
    assert config.log_config is None
    assert config._gym_obs_tcp_keepalive == (30, 5, 4)  # type: ignore[attr-defined]


def test_worker_refusal_names_the_key_and_the_reason() -> None:
    check_worker_count(1, "state in memory", where="servers.r")
    check_worker_count(4, None, where="servers.r")
    with pytest.raises(ServerStartupError, match=r"servers\.r\.num_workers=2: .*: state in memory"):
        check_worker_count(2, "state in memory", where="servers.r")


def test_bind_errors_name_the_server_and_reuse_port_shares_a_port() -> None:
    first = bind_listen_socket("127.0.0.1", 24501, where="servers.m")
    first.listen()
    try:
        with pytest.raises(
            ServerStartupError, match=r"servers\.m: cannot listen on 127\.0\.0\.1:24501: .*in use"
        ):
            bind_listen_socket("127.0.0.1", 24501, where="servers.m")
    finally:
        first.close()
    a = bind_listen_socket("127.0.0.1", 24502, reuse_port=True)
    b = bind_listen_socket("127.0.0.1", 24502, reuse_port=True)
    assert a.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 1
    a.close()
    b.close()


class _Transport:
    """Just enough of an asyncio transport for the protocol's connection_made."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {
            "socket": self.sock,
            "sockname": self.sock.getsockname(),
            "peername": self.sock.getpeername(),
        }.get(name, default)

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def is_closing(self) -> bool:
        return False

    def close(self) -> None: ...


def test_every_accepted_connection_gets_tcp_keepalive() -> None:
    client_config = GlobalAIOHTTPAsyncClientConfig(
        global_aiohttp_tcp_keepalive_idle_seconds=42,
        global_aiohttp_tcp_keepalive_interval_seconds=7,
        global_aiohttp_tcp_keepalive_probes=5,
    )

    async def app(scope: Any, receive: Any, send: Any) -> None: ...

    config = build_uvicorn_config(app, _instance(), client_config, where="servers.m")
    config.load()
    listener = socket.create_server(("127.0.0.1", 24503))
    with listener, socket.create_connection(("127.0.0.1", 24503)):
        accepted, _ = listener.accept()
        with accepted:
            assert accepted.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0
            import asyncio

            loop = asyncio.new_event_loop()
            try:
                from uvicorn.server import ServerState

                protocol = KeepaliveHttpToolsProtocol(
                    config=config, server_state=ServerState(), app_state={}, _loop=loop
                )
                protocol.connection_made(_Transport(accepted))  # type: ignore[arg-type]
            finally:
                loop.close()
            assert accepted.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 42
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 7
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 5


@pytest.mark.parametrize(
    "entries",
    [
        ["0.0.0.0/1", "128.0.0.0/1"],
        ["::ffff:0:0/97", "::ffff:128.0.0.0/97"],
        ["0.0.0.0/1", "::ffff:128.0.0.0/97"],  # IPv4 and IPv4-mapped halves together
        ["0.0.0.0/2", "64.0.0.0/2", "128.0.0.0/2", "192.0.0.0/3", "224.0.0.0/3"],
        # every IPv6 address outside the IPv4-mapped block: every IPv6 client
        [
            str(net)
            for net in ipaddress.ip_network("::/0").address_exclude(ipaddress.ip_network("::ffff:0:0/96"))
        ],
    ],
)
def test_entries_that_together_trust_everyone_are_refused(entries: list[str]) -> None:
    with pytest.raises(ServerStartupError) as caught:
        validate_forwarded_allow_ips(entries, proxy_headers=True, where="servers.m.forwarded_allow_ips")
    message = str(caught.value)
    assert message.startswith("servers.m.forwarded_allow_ips: entries ")
    assert "together cover every" in message and "which trusts every client" in message


def test_large_but_partial_unions_are_accepted() -> None:
    entries = ["0.0.0.0/1", "128.0.0.0/2", "::ffff:192.0.0.0/99"]  # 192.0.0.0/3 of 192.0.0.0/2 missing
    assert validate_forwarded_allow_ips(entries, proxy_headers=True) == entries


@pytest.mark.parametrize(("entry", "network"), [("127.0.0.1/8", "127.0.0.0/8"), ("fd00::1/64", "fd00::/64")])
def test_networks_with_host_bits_are_refused_with_the_fix(entry: str, network: str) -> None:
    with pytest.raises(ServerStartupError) as caught:
        validate_forwarded_allow_ips([entry], proxy_headers=True, where="servers.m.forwarded_allow_ips")
    message = str(caught.value)
    assert f"entry {entry!r} has host bits set" in message and repr(network) in message


def test_uvicorn_trusts_exactly_the_validated_entries() -> None:
    from uvicorn.middleware.proxy_headers import _TrustedHosts

    entries = [" 10.1.0.0/16 ", "192.168.1.7", "::ffff:10.2.0.0/112", "fd00::/8"]
    trusted = _TrustedHosts(validate_forwarded_allow_ips(entries, proxy_headers=True))
    for host in ("10.1.2.3", "192.168.1.7", "::ffff:10.2.0.9", "fd00::5"):
        assert host in trusted, host
    for host in ("10.2.0.9", "192.168.1.8", "::ffff:10.1.2.3", "fe80::1", "127.0.0.1"):
        assert host not in trusted, host


def test_request_limits_come_from_the_server_entry_and_are_validated() -> None:
    from pydantic import ValidationError

    from gym_obs.server._request_limits import RequestLimits

    config = build_uvicorn_config(
        object(),
        _instance(http_head_max_bytes=4096, http_head_timeout_s=2.5, http_body_max_bytes=10_000),
        GlobalAIOHTTPAsyncClientConfig(),
        where="servers.m",
    )
    assert config._gym_obs_request_limits == RequestLimits(4096, 2.5, 10_000)  # type: ignore[attr-defined]
    defaults = RequestLimits.from_server(_instance())
    assert defaults == RequestLimits(64 * 1024, 10.0, 1024**3)
    for bad in (
        {"http_head_max_bytes": 100},
        {"http_head_max_bytes": True},
        {"http_head_max_bytes": 64 * 1024 * 1024},
        {"http_head_timeout_s": 0},
        {"http_body_max_bytes": -1},
        {"http_body_max_bytes": False},
    ):
        with pytest.raises(ValidationError) as caught:
            _instance(**bad)
        assert next(iter(bad)) in str(caught.value)
