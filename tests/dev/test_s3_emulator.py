"""The S3 emulator behaves like S3 on connections and on metadata names (docs/development.md: Development,
The S3 emulator)."""

from __future__ import annotations

import http.client
from typing import Any
from urllib.parse import urlsplit

from devtools.moto import MotoServer
from shared.settings import Settings


def connection_to(moto: MotoServer) -> http.client.HTTPConnection:
    """A plain HTTP/1.1 connection to the emulator, opened at its first request."""
    address = urlsplit(moto.endpoint_url)
    assert address.hostname is not None and address.port is not None
    return http.client.HTTPConnection(address.hostname, address.port, timeout=10)


def test_a_connection_is_kept_alive_across_requests(moto: MotoServer) -> None:
    connection = connection_to(moto)
    try:
        sockets = []
        for _ in range(3):
            connection.request("GET", "/")
            answer = connection.getresponse()
            answer.read()
            assert answer.status == 200 and answer.version == 11
            assert (answer.getheader("Connection") or "").lower() != "close"
            sockets.append(connection.sock)
        # http.client drops its socket when the server closes: the same one throughout means it stayed open.
        assert sockets[0] is not None and all(sock is sockets[0] for sock in sockets)
    finally:
        connection.close()


def test_many_idle_connections_are_all_kept_alive(moto: MotoServer) -> None:
    # More than cheroot keeps by default (10): every pool of a running system shares the one emulator.
    connections = [connection_to(moto) for _ in range(24)]
    try:
        for connection in connections:
            connection.request("GET", "/")
            answer = connection.getresponse()
            answer.read()
            assert (answer.getheader("Connection") or "").lower() != "close", "an idle connection was refused"
        first = [connection.sock for connection in connections]
        for connection in connections:
            connection.request("GET", "/")
            connection.getresponse().read()
        assert all(sock is not None for sock in first)
        assert [connection.sock for connection in connections] == first
    finally:
        for connection in connections:
            connection.close()


async def test_metadata_names_keep_their_underscores(s3: Any, settings: Settings) -> None:
    # A server that drops `_` would lose the first; one that folds it would answer `my-key`.
    sent = {"my_key": "underscored", "other-key": "dashed", "plain": "kept"}
    await s3.put_object(Bucket=settings.s3_bucket, Key="meta/k", Body=b"x", Metadata=sent)
    head = await s3.head_object(Bucket=settings.s3_bucket, Key="meta/k")
    assert head["Metadata"] == sent
