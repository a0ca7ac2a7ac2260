"""Render a kustomization of ``deploy/kubernetes`` without ``kubectl`` (docs/kubernetes.md: Checked without a
cluster): the subset of kustomize the manifests use, and nothing else, so that a manifest using more fails
here instead of rendering something else than ``kubectl kustomize`` would.

Supported: ``resources`` (files, and folders holding a ``kustomization.yaml``), ``namespace``, ``labels`` (their
``pairs``, on each resource's own metadata), ``images`` (``newName``, ``newTag``, ``digest``), ``replicas`` and
``patches`` given by ``path`` (strategic merge: maps merged key by key, lists of maps with a ``name`` merged
by name). Usage: ``python -m devtools.kustomize deploy/kubernetes/overlays/production``.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import yaml

KNOWN_FIELDS = {"apiVersion", "kind", "resources", "namespace", "labels", "images", "replicas", "patches"}

# Kinds that live in no namespace, which ``namespace`` leaves as they are (the ones the manifests use).
CLUSTER_SCOPED = {"Namespace"}

Resource = dict[str, Any]


class KustomizeError(Exception):
    """A kustomization this renderer does not support, or a patch that matches nothing; the message says which."""


def render(folder: Path) -> list[Resource]:
    """The resources the kustomization in ``folder`` builds, in order. Raises ``KustomizeError``."""
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    unknown = set(kustomization) - KNOWN_FIELDS
    if unknown:
        raise KustomizeError(f"{folder}: unsupported fields {sorted(unknown)}")
    resources: list[Resource] = []
    for entry in kustomization.get("resources", []):
        path = folder / entry
        resources.extend(render(path) if path.is_dir() else load(path))
    for patch in kustomization.get("patches", []):
        for document in load(folder / patch["path"]):
            _apply_patch(resources, document)
    for replicas in kustomization.get("replicas", []):
        _target(resources, "Deployment", replicas["name"])["spec"]["replicas"] = replicas["count"]
    for image in kustomization.get("images", []):
        _set_image(resources, image)
    for labels in kustomization.get("labels", []):
        for resource in resources:
            resource["metadata"].setdefault("labels", {}).update(labels["pairs"])
    if "namespace" in kustomization:
        for resource in resources:
            if resource["kind"] not in CLUSTER_SCOPED:
                resource["metadata"]["namespace"] = kustomization["namespace"]
    return resources


def load(path: Path) -> list[Resource]:
    """The YAML documents of ``path``, empty ones left out."""
    return [document for document in yaml.safe_load_all(path.read_text()) if document]


def _target(resources: list[Resource], kind: str, name: str) -> Resource:
    for resource in resources:
        if resource["kind"] == kind and resource["metadata"]["name"] == name:
            return resource
    raise KustomizeError(f"no {kind} named {name} to change")


def _apply_patch(resources: list[Resource], patch: Resource) -> None:
    target = _target(resources, patch["kind"], patch["metadata"]["name"])
    merged = _merge(target, patch)
    target.clear()
    target.update(merged)


def _merge(base: Any, patch: Any) -> Any:
    """Strategic merge of ``patch`` into ``base``: maps key by key, lists of named maps by name, else replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = copy.deepcopy(base)
        for key, value in patch.items():
            merged[key] = _merge(base[key], value) if key in base else copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(patch, list) and all(_named(item) for item in [*base, *patch]):
        by_name = {item["name"]: item for item in base}
        merged_list = [_merge(by_name[item["name"]], item) if item["name"] in by_name else item for item in patch]
        patched = {item["name"] for item in patch}
        return [item for item in base if item["name"] not in patched] + merged_list
    return copy.deepcopy(patch)


def _named(item: Any) -> bool:
    return isinstance(item, dict) and "name" in item


def _set_image(resources: list[Resource], image: dict[str, str]) -> None:
    for resource in resources:
        spec = resource.get("spec", {}).get("template", {}).get("spec", {})
        for container in [*spec.get("containers", []), *spec.get("initContainers", [])]:
            if container["image"] == image["name"]:
                name = image.get("newName", image["name"])
                container["image"] = f"{name}@{image['digest']}" if "digest" in image else f"{name}:{image['newTag']}"


def main(argv: list[str] | None = None) -> int:
    """Print the rendered resources of the kustomization folder ``argv[0]`` as YAML documents."""
    [folder] = argv if argv is not None else sys.argv[1:]
    print(yaml.safe_dump_all(render(Path(folder)), sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
