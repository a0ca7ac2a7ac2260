"""The local processes' ports: free, outside the ephemeral range, never handed out twice, reserved machine-wide
(docs/development.md: Ports).
"""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from devtools import ports

# Two processes that each reserve this many ports of the ~22,000 below the ephemeral range pick some port in
# common about 7 times a run when nothing keeps them apart (400 * 400 / 22,768).
RESERVED_PER_PROCESS = 400

# Reserve the ports first and bind them only after both processes have reserved theirs, as servers started a
# moment after their ports were chosen do; print the ports that would not bind.
_RESERVE_THEN_BIND = f"""
import socket, sys
from devtools import ports
chosen = [ports.free_port() for _ in range({RESERVED_PER_PROCESS})]
print("reserved", flush=True)
sys.stdin.readline()
held, failed = [], []
for port in chosen:
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        held.append(sock)
    except OSError:
        failed.append(port)
print(" ".join(map(str, failed)), flush=True)
"""


def test_ports_are_below_the_ephemeral_range_and_distinct() -> None:
    chosen = [ports.free_port() for _ in range(300)]
    assert len(set(chosen)) == len(chosen)
    assert all(ports._LOWEST <= port < ports._ephemeral_low() for port in chosen)


def test_a_port_in_use_is_never_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    busy, spare = ports.free_port(), ports.free_port()
    for port in (busy, spare):  # reservable again, as ports nobody chose yet
        ports._release(port)
    with socket.socket() as held:
        held.bind(("127.0.0.1", busy))
        held.listen()
        draws = iter([busy, busy, spare])
        monkeypatch.setattr(ports.random, "randint", lambda low, high: next(draws))
        assert ports.free_port() == spare


def test_two_processes_reserving_at_once_never_get_the_same_port() -> None:
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _RESERVE_THEN_BIND],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        for child in children:
            assert child.stdout is not None and child.stdout.readline().strip() == "reserved"
        failed = []
        for child in children:
            assert child.stdin is not None and child.stdout is not None
            child.stdin.write("\n")
            child.stdin.flush()
            failed.append(child.stdout.readline().split())
    finally:
        for child in children:
            child.kill()
            child.wait()
    assert failed == [[], []]
