"""`HOST:PORT` listen addresses, as both processes take them (`--listen`, `--metrics-listen`)."""

from __future__ import annotations

MAX_PORT = 65535


def listen_address(value: str, *, flag: str) -> tuple[str, int]:
    """(host, port) from `HOST:PORT` (`[::1]:9400` for IPv6; an empty host means every
    address); ValueError naming `flag` and the value. Port 0 picks a free port."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or int(port) > MAX_PORT:
        raise ValueError(f"invalid {flag} option: {value!r} (want HOST:PORT)")
    return host.strip("[]") or "0.0.0.0", int(port)
