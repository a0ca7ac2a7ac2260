"""``deploy/compose.cluster.yaml`` merged over ``deploy/compose.yaml``, checked by its structure: every part
names the three RabbitMQ nodes and both PostgreSQL servers (read-write first), the nodes form one cluster
from one cookie and one peer list, and the parts wait for the whole cluster.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from devtools.compose import (
    CLUSTER_COMPOSE_FILE,
    ComposeError,
    load_compose,
    one_shots,
    parts,
    settings_from_environment,
)

SECRET = "a-test-secret-of-forty-eight-bytes-0123456789ab"
VARIABLES = {
    "CHATEXPORT_JWT_SECRET": SECRET,
    "CHATEXPORT_WEBHOOK_SIGNING_KEY": SECRET,
    "RABBITMQ_ERLANG_COOKIE": "a-shared-cookie",
    "POSTGRES_REPLICATION_PASSWORD": "a-replication-password",
}
SERVICES = load_compose(variables=VARIABLES, overrides=[CLUSTER_COMPOSE_FILE])
PROJECT = [service.name for service in [*parts(SERVICES), *one_shots(SERVICES)]]
RABBIT_NODES = ["rabbitmq", "rabbitmq-2", "rabbitmq-3"]
DATABASE_SERVERS = ["postgres", "postgres-standby"]


def hosts(url: str) -> list[str]:
    """The host names of a URL that may name several ``host:port`` pairs, in order."""
    return [pair.rsplit(":", 1)[0] for pair in urlsplit(url).netloc.rpartition("@")[2].split(",")]


def test_the_override_keeps_every_project_service() -> None:
    assert PROJECT == ["api", "relay", "worker", "janitor", "migrate"]


@pytest.mark.parametrize("name", PROJECT)
def test_every_project_service_names_each_broker_node(name: str) -> None:
    urls = SERVICES[name].environment["CHATEXPORT_AMQP_URL"].split(",")
    assert [host for url in urls for host in hosts(url)] == RABBIT_NODES


@pytest.mark.parametrize("name", PROJECT)
def test_every_project_service_names_both_database_servers_for_writes(name: str) -> None:
    environment = SERVICES[name].environment
    url = environment["CHATEXPORT_DATABASE_URL"]
    assert hosts(url) == DATABASE_SERVERS
    assert parse_qs(urlsplit(url).query) == {"target_session_attrs": ["read-write"]}
    assert hosts(environment["CHATEXPORT_DATABASE_READ_URL"]) == ["postgres-standby"]
    settings = settings_from_environment(environment)
    assert settings.environment == "production"


@pytest.mark.parametrize("name", [service.name for service in parts(SERVICES)])
def test_every_part_waits_for_the_whole_broker_cluster(name: str) -> None:
    dependencies = SERVICES[name].depends_on
    assert {node: dependencies.get(node) for node in RABBIT_NODES} == dict.fromkeys(RABBIT_NODES, "service_healthy")


def test_the_nodes_share_a_cookie_and_discover_each_other_by_host_name() -> None:
    nodes = [SERVICES[name] for name in RABBIT_NODES]
    assert {node.environment["RABBITMQ_ERLANG_COOKIE"] for node in nodes} == {"a-shared-cookie"}
    assert [node.spec["hostname"] for node in nodes] == RABBIT_NODES
    assert len({node.spec["image"] for node in nodes}) == 1
    peer_list = yaml.safe_load(CLUSTER_COMPOSE_FILE.read_text(encoding="utf-8"))["configs"]["rabbitmq-cluster"][
        "content"
    ]
    assert "cluster_formation.peer_discovery_backend = classic_config" in peer_list
    assert re.findall(r"classic_config\.nodes\.\d+ = rabbit@(\S+)", peer_list) == RABBIT_NODES
    volumes = [volume for node in nodes for volume in node.spec["volumes"]]
    assert len({volume.split(":")[0] for volume in volumes}) == len(RABBIT_NODES)  # a data volume each


def test_the_standby_is_a_base_backup_of_the_primary() -> None:
    primary, standby = SERVICES["postgres"], SERVICES["postgres-standby"]
    assert "wal_level=replica" in primary.command
    assert standby.depends_on == {"postgres": "service_healthy"}
    assert re.search(r"pg_basebackup -h postgres .*-R", " ".join(standby.command))


@pytest.mark.parametrize("missing", ["RABBITMQ_ERLANG_COOKIE", "POSTGRES_REPLICATION_PASSWORD"])
def test_the_cluster_secrets_are_required(missing: str) -> None:
    variables = {name: value for name, value in VARIABLES.items() if name != missing}
    with pytest.raises(ComposeError, match=missing):
        load_compose(variables=variables, overrides=[CLUSTER_COMPOSE_FILE])
