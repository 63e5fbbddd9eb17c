"""Turning a server's bind address into a URL a client can connect to."""

from __future__ import annotations

from typing import Final

_WILDCARD_HOSTS: Final = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1"}


def connectable_host(host: str) -> str:
    """A bind address a client can connect to: wildcard binds (0.0.0.0, ::) become loopback."""
    return _WILDCARD_HOSTS.get(host, host)


def server_base_url(host: str, port: int) -> str:
    """``http://host:port`` with wildcard hosts made connectable and IPv6 literals bracketed."""
    host = connectable_host(host)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"
