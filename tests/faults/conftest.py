"""Fixtures for fault-injection tests: private servers that a test may stop, crash and restart, and TCP
proxies that can cut a server off. Every test in this folder is marked ``e2e``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from devtools.servers import PrivatePostgres, PrivateRabbitMQ, TcpProxy
from shared.migrator import migrate

ServerT = TypeVar("ServerT", PrivatePostgres, PrivateRabbitMQ)

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test collected from this folder ``e2e`` (a conftest's ``pytestmark`` would not)."""
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture
def private_postgres(tmp_path: Path) -> Iterator[PrivatePostgres]:
    """A started PostgreSQL cluster of this test's own; deleted afterwards, its log kept as
    ``<tmp_path>/private-postgres.log`` (pytest keeps the last three runs' ``tmp_path``).
    """
    yield from _started(PrivatePostgres(), tmp_path / "private-postgres.log")


@pytest.fixture
def private_rabbitmq(tmp_path: Path) -> Iterator[PrivateRabbitMQ]:
    """A started RabbitMQ node of this test's own; deleted afterwards, its log kept as
    ``<tmp_path>/private-rabbitmq.log``.
    """
    yield from _started(PrivateRabbitMQ(), tmp_path / "private-rabbitmq.log")


def _started(server: ServerT, log_path: Path) -> Iterator[ServerT]:
    try:
        server.start()
        yield server
    finally:
        server.destroy(keep_log_as=log_path)


@pytest.fixture
async def private_database_url(private_postgres: PrivatePostgres) -> str:
    """The URL of a migrated ``chatexport`` database on ``private_postgres``."""
    url = await private_postgres.create_database("chatexport")
    await migrate(url)
    return url


@pytest.fixture
def tcp_proxy() -> Iterator[Callable[[str, int], TcpProxy]]:
    """``tcp_proxy(host, port)`` -> a started ``TcpProxy`` to that address; all are closed afterwards."""
    proxies: list[TcpProxy] = []

    def make(host: str, port: int) -> TcpProxy:
        proxy = TcpProxy(host, port)
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        proxy.close()
