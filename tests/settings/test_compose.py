"""``deploy/compose.yaml`` against the code it deploys: every variable it passes is a setting and the values
make valid production settings; every part runs the command of its CLI subcommand and reports its health
with ``chatexport health``; workers run as several replicas; the migrations run once, before any part;
compose waits longer than a part's shutdown grace. Also the reader of the file that the end-to-end
harness (``devtools.localsystem``) starts the system from.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path

import pydantic
import pytest
import yaml

from chatexport.cli import PARTS as PARTS_OF_CLI
from devtools.compose import (
    COMPOSE_FILE,
    SETTINGS_PREFIX,
    ComposeError,
    Service,
    duration_seconds,
    load_compose,
    one_shots,
    parts,
    settings_from_environment,
)
from devtools.localsystem import local_command, replica_names
from shared import tracing
from shared.settings import Settings

SECRET = "a-test-secret-of-forty-eight-bytes-0123456789ab"
SERVICES = load_compose(variables={"CHATEXPORT_JWT_SECRET": SECRET, "CHATEXPORT_WEBHOOK_SIGNING_KEY": SECRET})
OWN = [name for name, service in SERVICES.items() if service.own]
PARTS = [service.name for service in parts(SERVICES)]
DOCKERFILE = COMPOSE_FILE.parent / "Dockerfile"


def unknown_settings(environment: Mapping[str, str]) -> set[str]:
    """The names in ``environment`` that are neither exactly ``CHATEXPORT_<FIELD>`` for a field of ``Settings``
    nor the standard OpenTelemetry variable that turns tracing on (docs/monitoring.md: Monitoring, Traces).
    """
    known = {f"{SETTINGS_PREFIX}{field.upper()}" for field in Settings.model_fields} | set(tracing.ENDPOINT_VARIABLES)
    return set(environment) - known


def test_a_misspelt_or_unprefixed_setting_is_caught() -> None:
    environment = {"CHATEXPORT_LEASE_SECONDS": "4", "CHATEXPORT_LEASE_SECOND": "4", "LEASE_SECONDS": "4"}
    assert unknown_settings(environment) == {"CHATEXPORT_LEASE_SECOND", "LEASE_SECONDS"}


def test_the_project_services_are_the_cli_parts_and_the_one_shot_migrate() -> None:
    assert set(PARTS) == set(PARTS_OF_CLI)
    assert set(OWN) == {*PARTS_OF_CLI, "migrate"}


@pytest.mark.parametrize("name", OWN)
def test_every_variable_a_project_service_gets_is_a_setting(name: str) -> None:
    environment = SERVICES[name].environment
    assert environment
    assert unknown_settings(environment) == set()


@pytest.mark.parametrize("name", OWN)
def test_the_values_make_valid_production_settings(name: str) -> None:
    settings = settings_from_environment(SERVICES[name].environment)
    assert (settings.environment, settings.jwt_secret) == ("production", SECRET)
    assert (settings.metrics_host, settings.metrics_port) == ("0.0.0.0", 9100)


def test_the_file_requires_a_jwt_secret_and_settings_refuse_a_short_one() -> None:
    webhook_key = {"CHATEXPORT_WEBHOOK_SIGNING_KEY": SECRET}
    for variables in (webhook_key, {"CHATEXPORT_JWT_SECRET": "", **webhook_key}):
        with pytest.raises(ComposeError, match="CHATEXPORT_JWT_SECRET"):
            load_compose(variables=variables)
    short = load_compose(variables={"CHATEXPORT_JWT_SECRET": "too-short", **webhook_key})["api"].environment
    with pytest.raises(pydantic.ValidationError, match="at least 32 bytes"):
        settings_from_environment(short)


def test_the_file_requires_a_webhook_signing_key() -> None:
    for variables in (
        {"CHATEXPORT_JWT_SECRET": SECRET},
        {"CHATEXPORT_JWT_SECRET": SECRET, "CHATEXPORT_WEBHOOK_SIGNING_KEY": ""},
    ):
        with pytest.raises(ComposeError, match="CHATEXPORT_WEBHOOK_SIGNING_KEY"):
            load_compose(variables=variables)


@pytest.mark.parametrize("name", PARTS)
def test_every_part_runs_its_subcommand_and_reports_its_health_with_chatexport_health(name: str) -> None:
    service = SERVICES[name]
    assert service.command == ["chatexport", name]
    assert service.spec["healthcheck"]["test"] == ["CMD", "chatexport", "health"]


@pytest.mark.parametrize("name", PARTS)
def test_compose_waits_longer_than_the_parts_shutdown_grace(name: str) -> None:
    service = SERVICES[name]
    grace = settings_from_environment(service.environment).shutdown_grace_seconds
    assert service.stop_grace_seconds > grace


def test_workers_run_as_several_replicas() -> None:
    replicas = SERVICES["worker"].replicas
    assert replicas is not None and replicas > 1


def test_the_migrations_run_once_and_every_part_waits_for_them() -> None:
    migrate = SERVICES["migrate"]
    assert migrate.command == ["chatexport", "migrate"]
    assert migrate.spec["restart"] == "no"
    assert one_shots(SERVICES) == [migrate]
    for name in PARTS:
        assert SERVICES[name].depends_on["migrate"] == "service_completed_successfully"


def test_the_image_exposes_the_ports_the_file_uses() -> None:
    exposed = set(re.findall(r"^EXPOSE (.+)$", DOCKERFILE.read_text(encoding="utf-8"), re.MULTILINE)[0].split())
    api = settings_from_environment(SERVICES["api"].environment)
    assert {str(api.api_port), str(api.metrics_port)} <= exposed
    assert [mapping.rsplit(":", 1)[1] for mapping in SERVICES["api"].spec["ports"]] == [str(api.api_port)]


def _one_service(tmp_path: Path, spec: Mapping[str, object], variables: Mapping[str, str]) -> Service:
    path = tmp_path / "compose.yaml"
    path.write_text(yaml.safe_dump({"services": {"s": dict(spec)}}), encoding="utf-8")
    return load_compose(path, variables=variables)["s"]


@pytest.mark.parametrize(
    ("text", "variables", "expected"),
    [
        ("${A}", {"A": "1"}, "1"),
        ("${A}", {}, ""),
        ("$A/x", {"A": "1"}, "1/x"),
        ("$$A", {"A": "1"}, "$A"),
        ("${A:-d}", {}, "d"),
        ("${A:-d}", {"A": ""}, "d"),
        ("${A-d}", {"A": ""}, ""),
        ("${A-d}", {}, "d"),
        ("${A:?m}", {"A": "v"}, "v"),
        ("${A?m}", {"A": ""}, ""),
    ],
)
def test_interpolation_follows_the_compose_specification(
    tmp_path: Path, text: str, variables: dict[str, str], expected: str
) -> None:
    assert _one_service(tmp_path, {"environment": {"V": text}}, variables).environment == {"V": expected}


@pytest.mark.parametrize(("text", "variables"), [("${A:?need A}", {"A": ""}), ("${A?need A}", {})])
def test_a_required_variable_that_is_missing_is_an_error(tmp_path: Path, text: str, variables: dict[str, str]) -> None:
    with pytest.raises(ComposeError, match="need A"):
        _one_service(tmp_path, {"environment": {"V": text}}, variables)


def test_a_list_environment_takes_unset_values_from_the_shell(tmp_path: Path) -> None:
    service = _one_service(tmp_path, {"environment": ["A=1=2", "B", "C"]}, {"B": "b"})
    assert service.environment == {"A": "1=2", "B": "b"}


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30.0), ("1m30s", 90.0), ("500ms", 0.5), ("1h", 3600.0)])
def test_durations(text: str, seconds: float) -> None:
    assert duration_seconds(text) == seconds


@pytest.mark.parametrize("text", ["30", "30sec", "s", ""])
def test_a_malformed_duration_is_an_error(text: str) -> None:
    with pytest.raises(ComposeError):
        duration_seconds(text)


def test_replicas_are_numbered_and_a_single_process_takes_the_service_name() -> None:
    worker = SERVICES["worker"]
    assert replica_names(worker) == [f"worker-{n}" for n in range(1, (worker.replicas or 0) + 1)]
    assert replica_names(worker, 1) == ["worker"]
    assert replica_names(worker, 0) == []
    assert replica_names(SERVICES["api"]) == ["api"]


def test_the_image_executable_becomes_this_interpreter() -> None:
    assert local_command(["chatexport", "worker"])[-3:] == ["-m", "chatexport.cli", "worker"]
    with pytest.raises(ValueError, match="not a chatexport command"):
        local_command(["server", "/data"])


def test_the_runtime_path_imports_no_dev_tooling_or_demo_package() -> None:
    # What a production container imports to run any part: the CLI with every part (docs/architecture.md: How it works).
    probe = (
        "import sys, chatexport.cli; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('devtools', 'yaml', 'chatterbot_corpus')))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


def test_the_image_carries_the_runtime_packages_and_no_demo_extra() -> None:
    dockerfile = DOCKERFILE.read_text()
    copied = {line.split()[1] for line in dockerfile.splitlines() if line.startswith("COPY ")}
    assert copied == {"requirements/runtime.lock", "pyproject.toml", "chatexport", "shared", "services"}
    runtime_lock = (COMPOSE_FILE.parent.parent / "requirements" / "runtime.lock").read_text().lower()
    assert "chatterbot" not in runtime_lock and "\npyyaml==" not in runtime_lock
    project = tomllib.loads((COMPOSE_FILE.parent.parent / "pyproject.toml").read_text())["project"]
    assert not any(dependency.lower().startswith(("chatterbot", "pyyaml")) for dependency in project["dependencies"])
    assert {"chatterbot-corpus==1.3.3", "PyYAML>=6.0,<7"} <= set(project["optional-dependencies"]["demo"])


def test_the_tracing_profile_adds_a_trace_backend_the_parts_can_send_to() -> None:
    everything = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))["services"]
    backends = {name: spec for name, spec in everything.items() if "tracing" in spec.get("profiles", [])}
    assert list(backends) == ["jaeger"]
    (backend,) = backends.values()
    # Pinned, receiving OTLP over HTTP on this network, its UI on the host's loopback only.
    assert re.fullmatch(r"jaegertracing/jaeger:\d+\.\d+\.\d+", backend["image"])
    assert "4318" in backend["expose"] and backend["ports"] == ["127.0.0.1:16686:16686"]
    # Every other service runs without the profile, and every part passes the endpoint on, empty (off) by default.
    assert all("profiles" not in spec for name, spec in everything.items() if name != "jaeger")
    for name in PARTS:
        assert SERVICES[name].environment["OTEL_EXPORTER_OTLP_ENDPOINT"] == ""
    traced = load_compose(
        variables={
            "CHATEXPORT_JWT_SECRET": SECRET,
            "CHATEXPORT_WEBHOOK_SIGNING_KEY": SECRET,
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger:4318",
        }
    )
    assert {traced[name].environment["OTEL_EXPORTER_OTLP_ENDPOINT"] for name in PARTS} == {"http://jaeger:4318"}
