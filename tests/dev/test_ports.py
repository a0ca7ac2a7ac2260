"""The local processes' ports: free, outside the ephemeral range, never handed out twice."""

from __future__ import annotations

import socket

import pytest

from devtools import ports


def test_ports_are_below_the_ephemeral_range_and_distinct() -> None:
    chosen = [ports.free_port() for _ in range(300)]
    assert len(set(chosen)) == len(chosen)
    assert all(ports._LOWEST <= port < ports._ephemeral_low() for port in chosen)


def test_a_port_in_use_is_never_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    busy, spare = ports.free_port(), ports.free_port()
    with socket.socket() as held:
        held.bind(("127.0.0.1", busy))
        held.listen()
        monkeypatch.setattr(ports, "_handed_out", set())
        draws = iter([busy, busy, spare])
        monkeypatch.setattr(ports.random, "randint", lambda low, high: next(draws))
        assert ports.free_port() == spare
