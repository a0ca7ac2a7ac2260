"""The Kubernetes manifests, checked without a cluster (docs/kubernetes.md: Checked without a cluster): every
overlay rendered by ``devtools.kustomize``, each resource validated in strict mode against the Kubernetes
schemas of ``KUBERNETES_VERSION`` (``kubernetes-validate``), KEDA's against a minimal schema of the fields
used; then the invariants an operator relies on, each shown to fail on a manifest that breaks it; and the
autoscaling query run against the schema.
"""

from __future__ import annotations

import copy
import json
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import jsonschema
import kubernetes_validate
import pytest

from devtools.kustomize import Resource, load, render
from shared.settings import Settings
from tests.support.rows import insert_operation

REPO = Path(__file__).resolve().parents[2]
OVERLAYS = REPO / "deploy" / "kubernetes" / "overlays"
KUBERNETES_VERSION = "1.31.0"
# Minimal schemas of the custom resources' fields used (KEDA 2.x, the Prometheus Operator), by API group.
CUSTOM_SCHEMAS = {
    "keda.sh": json.loads((Path(__file__).parent / "keda_scaledobject.schema.json").read_text()),
    "monitoring.coreos.com": json.loads((Path(__file__).parent / "prometheusrule.schema.json").read_text()),
}
# The least the kubelet's grace must exceed CHATEXPORT_SHUTDOWN_GRACE_SECONDS by: the handing back of leases
# and the closing of connections after the drain.
GRACE_MARGIN_SECONDS = 10


def rendered(overlay: str) -> list[Resource]:
    return render(OVERLAYS / overlay)


def validate(resource: Resource) -> None:
    """Raise when ``resource`` is not valid for its kind (a kind without a schema is not valid)."""
    group = resource["apiVersion"].rpartition("/")[0]
    if group in CUSTOM_SCHEMAS:
        jsonschema.validate(resource, CUSTOM_SCHEMAS[group])
    else:
        kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)


def of_kind(resources: list[Resource], kind: str) -> list[Resource]:
    return [resource for resource in resources if resource["kind"] == kind]


def problems(resources: list[Resource]) -> list[str]:
    """What breaks the invariants (docs/kubernetes.md), one line each."""
    found = []
    [config] = [r for r in of_kind(resources, "ConfigMap") if r["metadata"]["name"] == "chatexport-config"]
    shutdown_grace = float(config["data"]["CHATEXPORT_SHUTDOWN_GRACE_SECONDS"])
    deployments = of_kind(resources, "Deployment")
    for deployment in deployments:
        name, template = deployment["metadata"]["name"], deployment["spec"]["template"]
        selector = deployment["spec"]["selector"]["matchLabels"]
        if not selector.items() <= template["metadata"]["labels"].items():
            found.append(f"{name}: the selector does not match the pod's labels")
        if name in AUTOSCALED and "replicas" in deployment["spec"]:
            found.append(f"{name}: replicas set while an autoscaler owns the count")
        spec = template["spec"]
        if spec.get("terminationGracePeriodSeconds", 30) < shutdown_grace + GRACE_MARGIN_SECONDS:
            found.append(f"{name}: the termination grace is not the shutdown grace plus {GRACE_MARGIN_SECONDS} s")
        if not spec.get("securityContext", {}).get("runAsNonRoot"):
            found.append(f"{name}: the pod may run as root")
        for container in spec["containers"]:
            found.extend(f"{name}/{container['name']}: {problem}" for problem in container_problems(container))
    for budget in of_kind(resources, "PodDisruptionBudget"):
        labels = budget["spec"]["selector"]["matchLabels"]
        if not any(labels.items() <= d["spec"]["template"]["metadata"]["labels"].items() for d in deployments):
            found.append(f"{budget['metadata']['name']}: the budget selects no pods")
    parts = {d["metadata"]["name"] for d in deployments}
    budgeted = {b["metadata"]["name"] for b in of_kind(resources, "PodDisruptionBudget")}
    found.extend(f"{part}: no PodDisruptionBudget" for part in sorted(parts - budgeted))
    return found


def container_problems(container: dict[str, Any]) -> list[str]:
    found = []
    image = container["image"]
    if image.endswith(":latest") or ("@" not in image and ":" not in image.rsplit("/", 1)[-1]):
        found.append(f"image {image} is neither a version nor a digest")
    resources = container.get("resources", {})
    if not {"cpu", "memory"} <= resources.get("requests", {}).keys() or "memory" not in resources.get("limits", {}):
        found.append("no cpu and memory requests and memory limit")
    paths = {probe: container.get(probe, {}).get("httpGet", {}).get("path") for probe in PROBES}
    if paths != PROBES:
        found.append(f"probes {paths}, not {PROBES}")
    security = container.get("securityContext", {})
    locked = (
        security.get("allowPrivilegeEscalation") is False
        and security.get("readOnlyRootFilesystem") is True
        and security.get("capabilities", {}).get("drop") == ["ALL"]
    )
    if not locked:
        found.append("the security context does not forbid escalation, writes to the root and capabilities")
    return found


# The Deployments whose replica count an autoscaler owns (the api's HPA, KEDA for the workers).
AUTOSCALED = {"chatexport-api", "chatexport-worker"}

# Startup and readiness on the dependencies (/readyz); liveness on the part's own loop only (/healthz).
PROBES = {"startupProbe": "/readyz", "readinessProbe": "/readyz", "livenessProbe": "/healthz"}


@pytest.mark.parametrize("overlay", ["development", "production"])
def test_every_resource_of_an_overlay_is_valid_in_strict_mode(overlay: str) -> None:
    resources = rendered(overlay)
    assert {
        "Deployment",
        "Job",
        "Service",
        "PodDisruptionBudget",
        "ScaledObject",
        "NetworkPolicy",
        "Namespace",
        "HorizontalPodAutoscaler",
    } <= {resource["kind"] for resource in resources}
    for resource in resources:
        validate(resource)


def test_the_monitoring_kustomization_is_valid_in_strict_mode() -> None:
    resources = render(OVERLAYS.parent / "monitoring")
    assert [resource["kind"] for resource in resources] == ["PrometheusRule"]
    for resource in resources:
        validate(resource)


def test_the_image_is_this_releases_version() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    kustomization = load(OVERLAYS.parent / "base" / "kustomization.yaml")[0]
    assert [image["newTag"] for image in kustomization["images"]] == [version]


@pytest.mark.parametrize("overlay", ["development", "production"])
def test_the_invariants_hold(overlay: str) -> None:
    resources = rendered(overlay)
    assert problems(resources) == []
    assert {d["metadata"]["name"] for d in of_kind(resources, "Deployment")} == {
        f"chatexport-{part}" for part in ("api", "relay", "worker", "janitor")
    }


def _worker(resources: list[Resource]) -> dict[str, Any]:
    [worker] = [d for d in of_kind(resources, "Deployment") if d["metadata"]["name"] == "chatexport-worker"]
    return worker


def _no_readiness(resources: list[Resource]) -> None:
    del _worker(resources)["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]


def _short_grace(resources: list[Resource]) -> None:
    _worker(resources)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 25


def _latest(resources: list[Resource]) -> None:
    _worker(resources)["spec"]["template"]["spec"]["containers"][0]["image"] = "ghcr.io/chatexport/chatexport:latest"


def _liveness_on_dependencies(resources: list[Resource]) -> None:
    container = _worker(resources)["spec"]["template"]["spec"]["containers"][0]
    container["livenessProbe"]["httpGet"]["path"] = "/readyz"


def _replicas_under_keda(resources: list[Resource]) -> None:
    _worker(resources)["spec"]["replicas"] = 2


@pytest.mark.parametrize(
    "breaking", [_no_readiness, _short_grace, _latest, _liveness_on_dependencies, _replicas_under_keda]
)
def test_a_manifest_that_breaks_an_invariant_fails(breaking: Callable[[list[Resource]], None]) -> None:
    resources = copy.deepcopy(rendered("production"))
    breaking(resources)
    assert [problem for problem in problems(resources) if problem.startswith("chatexport-worker")]


def test_a_misspelt_keda_field_fails_validation() -> None:
    [scaled] = of_kind(copy.deepcopy(rendered("production")), "ScaledObject")
    validate(scaled)
    scaled["spec"]["pollinginterval"] = scaled["spec"].pop("pollingInterval")
    with pytest.raises(jsonschema.ValidationError):
        validate(scaled)


def test_a_kind_without_a_schema_fails_validation() -> None:
    with pytest.raises(kubernetes_validate.utils.SchemaNotFoundError):
        validate({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}})


async def test_the_autoscaling_query_counts_waiting_and_running_work(database_url: str) -> None:
    [scaled] = of_kind(rendered("production"), "ScaledObject")
    query = scaled["spec"]["triggers"][0]["metadata"]["query"]
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        assert await pool.fetchval(query) == 0
        for number, state in enumerate(["QUEUED", "RUNNING", "RUNNING", "SUCCEEDED", "RETRY_AT", "FAILED"]):
            await insert_operation(pool, f"op_scale_{number}", state)
        await pool.execute(
            "INSERT INTO export_chunks (operation_id, chunk_no, state, after_seq, last_seq, estimated_bytes)"
            " SELECT 'op_scale_1', n, s, n * 10, n * 10 + 10, 1000"
            " FROM unnest(ARRAY[1, 2, 3, 4], ARRAY['QUEUED', 'RUNNING', 'DONE', 'PENDING']) AS c(n, s)"
        )
        assert await pool.fetchval(query) == 3 + 2  # QUEUED and RUNNING operations, and chunks
    finally:
        await pool.close()


def test_the_worker_may_patch_its_pods_deletion_cost_and_nothing_else() -> None:
    resources = rendered("production")
    spec = _worker(resources)["spec"]["template"]["spec"]
    env = {
        variable["name"]: variable["valueFrom"]["fieldRef"]["fieldPath"] for variable in spec["containers"][0]["env"]
    }
    assert env == {
        "CHATEXPORT_KUBERNETES_POD_NAME": "metadata.name",
        "CHATEXPORT_KUBERNETES_NAMESPACE": "metadata.namespace",
    }
    [binding] = of_kind(resources, "RoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": spec["serviceAccountName"]}]
    [role] = [r for r in of_kind(resources, "Role") if r["metadata"]["name"] == binding["roleRef"]["name"]]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}]


@pytest.mark.parametrize("overlay", ["development", "production"])
def test_every_variable_the_manifests_set_is_a_setting(overlay: str) -> None:
    known = {f"CHATEXPORT_{name.upper()}" for name in Settings.model_fields}
    resources = rendered(overlay)
    named = {name for config in of_kind(resources, "ConfigMap") for name in config["data"]}
    named |= {name for secret in of_kind(resources, "Secret") for name in secret.get("stringData", {})}
    for deployment in of_kind(resources, "Deployment"):
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            named |= {variable["name"] for variable in container.get("env", [])}
    assert named and named <= known, named - known
