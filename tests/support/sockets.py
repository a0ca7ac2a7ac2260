"""Ports for servers a test starts in its own process, never chosen first and bound later (docs/development.md:
Ports): a socket bound to port 0 and handed to the server, or held bound and silent where the test needs an
address that refuses connections.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator

HOST = "127.0.0.1"


def handed_socket() -> tuple[int, int]:
    """A listening socket on ``HOST``, bound to port 0, for a server to take over: (file descriptor for its
    ``*_socket_fd`` setting, port). The server owns the descriptor; once it closes it, the port is free again.
    """
    with socket.create_server((HOST, 0)) as listening:
        return os.dup(listening.fileno()), listening.getsockname()[1]


@contextlib.contextmanager
def refusing_socket() -> Iterator[socket.socket]:
    """A socket bound to a port on ``HOST`` that does not listen: connections to it are refused, and no other
    server takes the port while the block runs. ``listen()`` on it (or a server given it) starts answering.
    """
    with socket.socket() as bound:
        bound.bind((HOST, 0))
        yield bound
