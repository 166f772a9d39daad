"""HOST:PORT addresses, as every process and the client write them (IPv6 in brackets).

Shared by the servers, the fast channel, the security settings and the client: it sits
below all of them, so none of them imports another for it.
"""

from __future__ import annotations


def split_address(address: str) -> tuple[str, int]:
    """"HOST:PORT" or "[V6]:PORT" -> (host, port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{address!r} is not HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


def join_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
