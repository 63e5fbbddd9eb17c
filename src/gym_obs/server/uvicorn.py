"""uvicorn glue: TCP keepalive and request limits on every connection, the proxy allow-list, worker rules.

Everything that decides *how* a gym server listens lives here so the rules are checked once, before uvicorn
starts, with errors that name the config key: the launcher runs the same checks up front for every server.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections.abc import Callable, Sequence
from typing import Any

import uvicorn

from gym_obs.config import GlobalAIOHTTPAsyncClientConfig, ServerInstanceConfig
from gym_obs.server._heap import freeze_startup_heap
from gym_obs.server._request_limits import LimitedHttpToolsProtocol, RequestLimits, attach_request_limits

__all__ = [
    "KeepaliveHttpToolsProtocol",
    "ServerStartupError",
    "bind_listen_socket",
    "build_uvicorn_config",
    "check_worker_count",
    "serve_uvicorn",
    "validate_forwarded_allow_ips",
]

_KEEPALIVE_ATTR = "_gym_obs_tcp_keepalive"
# Every IPv4 client reaches a dual-stack listener as ::ffff:a.b.c.d; trusting this network trusts everyone.
_IPV4_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
_ALL_IPV4 = ipaddress.IPv4Network("0.0.0.0/0")
_ALL_IPV6 = ipaddress.IPv6Network("::/0")

_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class ServerStartupError(RuntimeError):
    """A server refused to start because of its configuration; the message names the key and the fix."""


# --- proxy headers -----------------------------------------------------------------------------------------


def _parse_proxy_entry(entry: str, where: str) -> _Network:
    """One entry as a network; ServerStartupError if it trusts everyone or is not an address at all."""
    if entry == "*":
        raise ServerStartupError(f"{where}: entry '*' would trust every client; list the proxy addresses")
    try:
        network = ipaddress.ip_network(entry, strict=False)
    except ValueError:
        raise ServerStartupError(
            f"{where}: entry {entry!r} is not an IP address or network (e.g. 10.0.0.5 or 10.0.0.0/24)"
        ) from None
    if network.prefixlen == 0:
        raise ServerStartupError(f"{where}: entry {entry!r} is a /0 network that trusts every client")
    if isinstance(network, ipaddress.IPv6Network) and _IPV4_MAPPED.subnet_of(network):
        raise ServerStartupError(
            f"{where}: entry {entry!r} covers every IPv4-mapped IPv6 address (::ffff:0:0/96), "
            "which trusts every IPv4 client"
        )
    return network


def _check_parsed_as_uvicorn_does(entry: str, network: _Network, where: str) -> None:
    """uvicorn reads an entry with ``/`` as a *strict* network and anything else as an address; whatever
    fails becomes a literal no client address ever equals. Refuse what uvicorn would silently never trust,
    so what passes here is exactly what uvicorn trusts."""
    try:
        if "/" in entry:
            ipaddress.ip_network(entry, strict=True)
        else:
            ipaddress.ip_address(entry)
    except ValueError:
        address = entry.split("/", 1)[0]
        raise ServerStartupError(
            f"{where}: entry {entry!r} has host bits set, and uvicorn would never trust it; "
            f"write the network {str(network)!r} or the address {address!r}"
        ) from None


def _as_ipv4(network: _Network) -> ipaddress.IPv4Network | None:
    """The IPv4 clients a network trusts: itself, or its IPv4-mapped part (how a dual-stack listener sees
    IPv4 clients)."""
    if isinstance(network, ipaddress.IPv4Network):
        return network
    if network.prefixlen <= _IPV4_MAPPED.prefixlen:
        return _ALL_IPV4 if _IPV4_MAPPED.subnet_of(network) else None
    if not network.subnet_of(_IPV4_MAPPED):
        return None
    low = int(network.network_address) & 0xFFFFFFFF
    return ipaddress.IPv4Network((low, network.prefixlen - _IPV4_MAPPED.prefixlen))


def _trusts_everyone(networks: Sequence[_Network]) -> str | None:
    """Why these entries *together* trust every client (IPv4, IPv4-mapped or IPv6), or None."""
    ipv4 = [net for net in (_as_ipv4(network) for network in networks) if net is not None]
    if list(ipaddress.collapse_addresses(ipv4)) == [_ALL_IPV4]:
        return "together cover every IPv4 address (IPv4-mapped IPv6 entries included)"
    ipv6 = [net for net in networks if isinstance(net, ipaddress.IPv6Network)]
    if list(ipaddress.collapse_addresses([*ipv6, _IPV4_MAPPED])) == [_ALL_IPV6]:
        return "together cover every IPv6 address"
    return None


def validate_forwarded_allow_ips(
    entries: Sequence[str] | None, *, proxy_headers: bool, where: str = "forwarded_allow_ips"
) -> list[str]:
    """The trusted-proxy list uvicorn gets, or ServerStartupError naming the offending entry.

    Proxy headers let a client claim any address, so they are honoured only from an explicit, non-empty
    list of proxies. Refused: wildcards (``*``, any ``/0``, anything covering every IPv4-mapped IPv6
    address), lists whose entries together cover every address (``0.0.0.0/1`` + ``128.0.0.0/1``), and
    networks with host bits set (``127.0.0.1/8``: uvicorn parses strictly and would never trust it). What
    is accepted is exactly what uvicorn trusts. With proxy headers off the list is not used.
    """
    if not proxy_headers:
        return []
    if not entries:
        raise ServerStartupError(
            f"{where}: proxy_headers is on, so a non-empty list of trusted proxy addresses is required"
        )
    allowed: list[str] = []
    networks: list[_Network] = []
    for raw in entries:
        entry = str(raw).strip()
        network = _parse_proxy_entry(entry, where)
        _check_parsed_as_uvicorn_does(entry, network, where)
        allowed.append(entry)
        networks.append(network)
    reason = _trusts_everyone(networks)
    if reason is not None:
        raise ServerStartupError(
            f"{where}: entries {', '.join(map(repr, allowed))} {reason}, which trusts every client; "
            "list only the proxy addresses"
        )
    return allowed


# --- workers -----------------------------------------------------------------------------------------------


def check_worker_count(num_workers: int, unsupported_reason: str | None, *, where: str) -> None:
    """Refuse several workers for a server that cannot share state between processes."""
    if num_workers > 1 and unsupported_reason:
        raise ServerStartupError(
            f"{where}.num_workers={num_workers}: this server cannot run more than one worker: "
            f"{unsupported_reason}"
        )


# --- TCP keepalive -----------------------------------------------------------------------------------------


def _keepalive_settings(client: GlobalAIOHTTPAsyncClientConfig) -> tuple[int, int, int]:
    return (
        client.global_aiohttp_tcp_keepalive_idle_seconds,
        client.global_aiohttp_tcp_keepalive_interval_seconds,
        client.global_aiohttp_tcp_keepalive_probes,
    )


def _set_tcp_keepalive(sock: Any, idle: int, interval: int, probes: int) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if hasattr(socket, "TCP_KEEPIDLE"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        elif hasattr(socket, "TCP_KEEPALIVE"):  # macOS spells the idle time differently
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPALIVE, idle)
        if hasattr(socket, "TCP_KEEPINTVL"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
        if hasattr(socket, "TCP_KEEPCNT"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, probes)
    except OSError:
        pass  # not a TCP socket (unix socket in tests): nothing to keep alive


class KeepaliveHttpToolsProtocol(LimitedHttpToolsProtocol):
    """httptools protocol that turns on TCP keepalive for every accepted connection (and bounds requests).

    A peer that vanishes without a FIN (a crashed host, a dropped NAT entry) would otherwise hold the
    connection and its handler forever; the settings are the client pools', so both ends agree. They travel
    on the uvicorn Config (picklable), so spawned workers get them too.
    """

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        settings = getattr(self.config, _KEEPALIVE_ATTR, None)
        if settings is not None:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                _set_tcp_keepalive(sock, *settings)


# --- config and serving ------------------------------------------------------------------------------------


def build_uvicorn_config(
    app: Any,
    server: ServerInstanceConfig,
    client: GlobalAIOHTTPAsyncClientConfig,
    *,
    where: str,
    factory: bool = False,
) -> uvicorn.Config:
    """A uvicorn Config from a server's entry of the global config (validated: raises ServerStartupError)."""
    allowed = validate_forwarded_allow_ips(
        server.forwarded_allow_ips, proxy_headers=server.proxy_headers, where=f"{where}.forwarded_allow_ips"
    )
    config = uvicorn.Config(
        app,
        host=server.host,
        port=server.port,
        http=KeepaliveHttpToolsProtocol,
        lifespan="on",
        log_config=None,  # gym_obs.telemetry.logging owns the handlers
        log_level=server.log_level,
        access_log=server.access_log,
        proxy_headers=server.proxy_headers,
        forwarded_allow_ips=allowed or None,
        backlog=server.backlog,
        timeout_keep_alive=server.timeout_keep_alive_s,
        server_header=False,
        workers=server.num_workers,
        factory=factory,
    )
    setattr(config, _KEEPALIVE_ATTR, _keepalive_settings(client))
    attach_request_limits(config, RequestLimits.from_server(server))
    return config


def bind_listen_socket(
    host: str, port: int, *, reuse_port: bool = False, where: str = "server"
) -> socket.socket:
    """Bind the listening socket ourselves so SO_REUSEPORT and the bind error are under our control."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            if not hasattr(socket, "SO_REUSEPORT"):
                raise ServerStartupError(f"{where}.reuse_port: SO_REUSEPORT is not available here")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        reason = "the address is already in use" if error.errno == errno.EADDRINUSE else str(error)
        raise ServerStartupError(f"{where}: cannot listen on {host}:{port}: {reason}") from None
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def serve_uvicorn(
    config: uvicorn.Config, sock: socket.socket, *, on_exit: Callable[[], object] | None = None
) -> None:
    """Run uvicorn on an already bound socket until SIGINT/SIGTERM; ``on_exit`` runs afterwards (flush).

    A single process freezes its startup objects first (:mod:`gym_obs.server._heap`); each of several
    workers freezes its own once its app is built (``_worker_app``).
    """
    try:
        if config.workers > 1:
            from uvicorn.supervisors import Multiprocess

            Multiprocess(config, sockets=[sock]).run()
        else:
            freeze_startup_heap()
            uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
        if on_exit is not None:
            on_exit()
