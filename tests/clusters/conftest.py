"""Fixtures for tests on local clusters: a three-node RabbitMQ cluster and PostgreSQL primaries with streaming
standbys (``devtools.clusters``). Every test in this folder is marked ``cluster`` and ``e2e``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from devtools.clusters import PostgresCluster, RabbitCluster

HERE = Path(__file__).parent


# The modules on PostgreSQL clusters alone: `make test-clusters` runs them on a process of their own, beside
# those on the RabbitMQ cluster (the chaos sample, on both, goes with the latter, which forms the cluster once).
POSTGRES_ONLY = {
    "test_database_failover.py",
    "test_failover_drain.py",
    "test_postgres_cluster.py",
    "test_standby_reads.py",
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test collected from this folder ``cluster`` and ``e2e`` (a conftest's ``pytestmark`` would
    not), and put it in the xdist group of its cluster (``--dist loadgroup``: one group, one process; none
    under ``-p no:xdist``). First among the hooks, before the top conftest's, which gives every test without a
    group its file's.
    """
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.cluster)
            item.add_marker(pytest.mark.e2e)
            if not config.pluginmanager.hasplugin("xdist"):
                continue
            group = "postgres-clusters" if item.path.name in POSTGRES_ONLY else "rabbitmq-cluster"
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="session")
def shared_rabbit_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitCluster]:
    """One started three-node cluster for the session: forming it takes about 15 s, so every test that needs
    one shares it (each with its own queue names). Its logs are kept in a ``rabbit-cluster`` temp folder.
    """
    cluster = RabbitCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy(keep_logs_in=tmp_path_factory.mktemp("rabbit-cluster"))


@pytest.fixture
def rabbit_cluster(shared_rabbit_cluster: RabbitCluster) -> RabbitCluster:
    """The session's cluster with every node running: whatever an earlier test stopped or killed (and left
    down, say because it failed) is started again first.
    """
    shared_rabbit_cluster.start()
    return shared_rabbit_cluster


@pytest.fixture
async def make_postgres_cluster(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[PostgresCluster]]]:
    """``await make_postgres_cluster(standbys=1, synchronous=False)`` -> a started ``PostgresCluster`` of this
    test's own (about 3 s); all are destroyed afterwards, their logs kept in ``<tmp_path>/postgres-<i>/``.
    """
    clusters: list[PostgresCluster] = []

    async def make(standbys: int = 1, *, synchronous: bool = False) -> PostgresCluster:
        cluster = PostgresCluster(standbys, synchronous=synchronous)
        clusters.append(cluster)
        await asyncio.to_thread(cluster.start)
        return cluster

    yield make
    for index, cluster in enumerate(clusters, 1):
        logs = tmp_path / f"postgres-{index}"
        logs.mkdir()
        await asyncio.to_thread(cluster.destroy, logs)


@pytest.fixture
async def postgres_cluster(make_postgres_cluster: Callable[..., Awaitable[PostgresCluster]]) -> PostgresCluster:
    """A started primary with one standby, asynchronous replication."""
    return await make_postgres_cluster()
