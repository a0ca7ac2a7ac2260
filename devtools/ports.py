"""Free TCP ports for the local processes that development and tests start.

A port chosen by binding port 0 comes from the kernel's ephemeral range, the same range every outgoing
connection takes its local port from: between the choice and the child's own bind, a connection of any
process (a worker's to RabbitMQ, a test's to PostgreSQL) may take it, and the child exits with "address
already in use". So ports are chosen below that range, at random, checked free with a bind, and never
handed out twice by one process (two parts started together must not get the same one).
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

# Linux's default ephemeral range starts at 32768; a machine that moved it lower is read at run time.
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_DEFAULT_EPHEMERAL_LOW = 32768
_LOWEST = 10000  # above the well-known and most registered service ports
_ATTEMPTS = 200
_handed_out: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now, outside the ephemeral range, not returned
    before by this process. Raises ``RuntimeError`` when no such port is found in a few hundred tries.
    """
    low, high = _LOWEST, _ephemeral_low() - 1
    for _ in range(_ATTEMPTS):
        port = random.randint(low, high)
        if port not in _handed_out and _bindable(host, port):
            _handed_out.add(port)
            return port
    raise RuntimeError(f"no free port on {host} in {low}-{high}")


def _ephemeral_low() -> int:
    try:
        low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _DEFAULT_EPHEMERAL_LOW
    # A range reaching down to our floor leaves no room outside it: use the default split then.
    return low if low > _LOWEST + 1000 else _DEFAULT_EPHEMERAL_LOW


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True
