"""``deploy/compose.yaml`` read the way ``docker compose`` reads it, for the local system
(``devtools.localsystem``) and the tests of the deployment: each service's command, environment, replica
count, dependencies and stop grace period.

Covers what a compose file of this project uses: ``x-`` extension fields shared through YAML anchors and
``<<`` merges (PyYAML's safe loader resolves both), ``environment`` as a mapping or a ``KEY=VALUE`` list,
``command`` as a list or a string, ``deploy.replicas``, ``depends_on`` in its short and long forms, and the
interpolation of ``$$``, ``$VAR``, ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?message}`` and
``${VAR?message}`` (compose specification, "Interpolation"; nested interpolation is not supported).
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from shared.settings import Settings

COMPOSE_FILE = Path(__file__).resolve().parents[1] / "deploy" / "compose.yaml"
# Merged over COMPOSE_FILE (``overrides``): the same service on a RabbitMQ cluster and a primary with a standby.
CLUSTER_COMPOSE_FILE = COMPOSE_FILE.with_name("compose.cluster.yaml")
SETTINGS_PREFIX = "CHATEXPORT_"
# What compose assumes when a service names none (compose specification, "stop_grace_period").
DEFAULT_STOP_GRACE = "10s"
ONE_SHOT_CONDITION = "service_completed_successfully"

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_VARIABLE = re.compile(
    rf"\$(?:(?P<escaped>\$)|\{{(?P<braced>{_NAME})(?:(?P<operator>:?[-?])(?P<argument>[^}}]*))?\}}|(?P<named>{_NAME}))"
)
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(us|ms|h|m|s)")
_DURATION_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}


class ComposeError(ValueError):
    """The compose file cannot be read as compose would: a required variable is unset, a value is malformed."""


@dataclass(frozen=True)
class Service:
    """One service: ``spec`` is its definition after merges and interpolation, ``environment`` its variables."""

    name: str
    spec: Mapping[str, Any]
    environment: Mapping[str, str]

    @property
    def own(self) -> bool:
        """True for the project's own services, the ones built from this repository (``build:``)."""
        return "build" in self.spec

    @property
    def command(self) -> list[str]:
        """The command as an argument list (a string command is split as a shell would); empty when unset."""
        command = self.spec.get("command") or []
        return shlex.split(command) if isinstance(command, str) else [str(argument) for argument in command]

    @property
    def replicas(self) -> int | None:
        """``deploy.replicas`` when the file declares it; compose starts one container otherwise."""
        replicas = (self.spec.get("deploy") or {}).get("replicas")
        return None if replicas is None else int(replicas)

    @property
    def depends_on(self) -> dict[str, str]:
        """``{service: condition}``; the short (list) form means ``service_started``."""
        dependencies = self.spec.get("depends_on") or {}
        if isinstance(dependencies, list):
            return dict.fromkeys(dependencies, "service_started")
        return {name: (rule or {}).get("condition", "service_started") for name, rule in dependencies.items()}

    @property
    def stop_grace_seconds(self) -> float:
        """How long compose waits after the stop signal before it kills the container, in seconds."""
        return duration_seconds(str(self.spec.get("stop_grace_period", DEFAULT_STOP_GRACE)))


def load_compose(
    path: Path = COMPOSE_FILE, *, variables: Mapping[str, str], overrides: Sequence[Path] = ()
) -> dict[str, Service]:
    """The services of the compose file at ``path``, in file order, interpolated from ``variables`` (what
    compose takes from the shell's environment), with the files ``overrides`` merged over it in order, as
    ``docker compose -f path -f override ...`` merges them: mappings key by key, anything else replaced
    (compose appends some sequences, such as ``ports``; this reader replaces them too).

    Raises ``ComposeError`` when a ``${VAR:?message}`` variable is unset, ``yaml.YAMLError`` on bad YAML.
    """
    documents = [
        _interpolate(yaml.safe_load(file.read_text(encoding="utf-8")), variables) for file in (path, *overrides)
    ]
    document = functools.reduce(_merged, documents)
    return {
        name: Service(name, spec, _environment(spec.get("environment"), variables))
        for name, spec in document["services"].items()
    }


def required_variables(*paths: Path) -> set[str]:
    """The names of the variables that the compose files at ``paths`` require from the shell: those of a
    ``${VAR:?message}`` or ``${VAR?message}`` interpolation anywhere in a file, comments aside (``load_compose``
    raises ``ComposeError`` when one is unset). Raises ``OSError`` when a file cannot be read.
    """
    found: set[str] = set()
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.lstrip().startswith("#"):
                continue
            found |= {match["braced"] for match in _VARIABLE.finditer(line) if (match["operator"] or "").endswith("?")}
    return found


def one_shots(services: Mapping[str, Service]) -> list[Service]:
    """Services another one waits for to complete (``service_completed_successfully``), in file order."""
    awaited = {
        name for service in services.values() for name, rule in service.depends_on.items() if rule == ONE_SHOT_CONDITION
    }
    return [service for name, service in services.items() if name in awaited]


def parts(services: Mapping[str, Service]) -> list[Service]:
    """The project's long-running services: its own, except the one-shots."""
    done_once = {service.name for service in one_shots(services)}
    return [service for service in services.values() if service.own and service.name not in done_once]


def settings_from_environment(environment: Mapping[str, str]) -> Settings:
    """``Settings`` from the ``CHATEXPORT_*`` entries of ``environment`` alone (not this process's).

    Entries that name no setting are ignored, as ``Settings`` itself ignores them. Raises
    ``pydantic.ValidationError`` when a value is invalid.
    """
    values = {
        key.removeprefix(SETTINGS_PREFIX).lower(): value
        for key, value in environment.items()
        if key.startswith(SETTINGS_PREFIX)
    }
    return Settings.model_validate({name: value for name, value in values.items() if name in Settings.model_fields})


def duration_seconds(text: str) -> float:
    """A compose duration such as ``30s``, ``1m30s`` or ``500ms``, in seconds; raises ``ComposeError``."""
    pieces = _DURATION_PART.findall(text)
    if not pieces or "".join(number + unit for number, unit in pieces) != text:
        raise ComposeError(f"not a compose duration: {text!r}")
    return sum(float(number) * _DURATION_UNITS[unit] for number, unit in pieces)


def _merged(base: Any, override: Any) -> Any:
    """``override`` merged over ``base``: mappings recursively, key by key; any other value replaces."""
    if not (isinstance(base, dict) and isinstance(override, dict)):
        return override
    return {**base, **{key: _merged(base.get(key), value) for key, value in override.items()}}


def _interpolate(node: Any, variables: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return _VARIABLE.sub(lambda match: _substitute(match, variables), node)
    if isinstance(node, list):
        return [_interpolate(item, variables) for item in node]
    if isinstance(node, dict):
        return {key: _interpolate(value, variables) for key, value in node.items()}
    return node


def _substitute(match: re.Match[str], variables: Mapping[str, str]) -> str:
    if match["escaped"]:
        return "$"
    name = match["braced"] or match["named"]
    value = variables.get(name)
    operator = match["operator"] or ""
    # With a colon, an empty value counts as unset.
    if value is not None and not (operator.startswith(":") and value == ""):
        return value
    if operator.endswith("-"):
        return match["argument"]
    if operator.endswith("?"):
        raise ComposeError(f"{name} is required: {match['argument'] or 'not set'}")
    return ""  # compose substitutes an unset variable with an empty string


def _environment(entries: Mapping[str, Any] | list[str] | None, variables: Mapping[str, str]) -> dict[str, str]:
    """A service's ``environment`` as a mapping; an entry without a value takes the shell's, if it has one."""
    if isinstance(entries, list):
        entries = {key: value if sep else None for key, sep, value in (entry.partition("=") for entry in entries)}
    values = {key: variables.get(key) if value is None else value for key, value in (entries or {}).items()}
    return {key: str(value) for key, value in values.items() if value is not None}
