"""Free TCP ports for the local processes that development and tests start, reserved machine-wide.

A port chosen by binding port 0 comes from the kernel's ephemeral range, the same range every outgoing
connection takes its local port from: between the choice and the child's own bind, a connection of any
process (a worker's to RabbitMQ, a test's to PostgreSQL) may take it, and the child exits with "address
already in use". So ports are chosen below that range, at random, and checked free with a bind. Between that
check and the child's bind, another process choosing the same way (a second test run, another pytest worker)
could pick the same port: so each port is first reserved with an exclusive lock on a file named by it, in a
folder every process on the machine shares, and the lock is held until this process exits (docs/development.md:
Ports). A server that can bind port 0 itself and report what it got needs none of this.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path

# Linux's default ephemeral range starts at 32768; a machine that moved it lower is read at run time.
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_DEFAULT_EPHEMERAL_LOW = 32768
_LOWEST = 10000  # above the well-known and most registered service ports
_ATTEMPTS = 200
RESERVATIONS = Path(tempfile.gettempdir()) / "chatexport-ports"
_held: dict[int, int] = {}  # port -> the open descriptor of its locked reservation file


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now, outside the ephemeral range, reserved for this
    process until it exits: no process of this machine that reserves through this function gets it too, and
    this process never gets it twice. Raises ``RuntimeError`` when no such port is found in a few hundred
    tries.
    """
    low, high = _LOWEST, _ephemeral_low() - 1
    for _ in range(_ATTEMPTS):
        port = random.randint(low, high)
        if port in _held or not _reserve(port):
            continue
        if _bindable(host, port):
            return port
        _release(port)
    raise RuntimeError(f"no free port on {host} in {low}-{high}")


def _reserve(port: int) -> bool:
    """Take the lock on ``port``'s reservation file without waiting; False when another process holds it."""
    if not RESERVATIONS.is_dir():
        RESERVATIONS.mkdir(exist_ok=True)
        with contextlib.suppress(PermissionError):  # shared by every user's runs, like the folder it is in
            os.chmod(RESERVATIONS, 0o1777)  # noqa: S103 - sticky, as the temporary folder itself
    # Read-only: a lock needs no write access, so a file another user created serves as well.
    fd = os.open(RESERVATIONS / str(port), os.O_RDONLY | os.O_CREAT, 0o444)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    _held[port] = fd
    return True


def _release(port: int) -> None:
    os.close(_held.pop(port))  # closing the descriptor drops the lock


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
