"""The worker's pod deletion cost (docs/kubernetes.md: Stopping and scaling down): on Kubernetes, a scale-down
removes the pods of lowest ``controller.kubernetes.io/pod-deletion-cost`` first, so the worker keeps its own
pod's annotation at what it holds: 0 when idle, more for each export, much more for each chunk (a chunk is a
share of a big export). Off unless ``kubernetes_pod_name`` is set, and off for good once the API refuses the
patch (no RBAC to patch pods): the manifests grant it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import Callable
from pathlib import Path

import aiohttp

from shared.lifecycle import sleep_unless_stopped
from shared.settings import KubernetesSettings

log = logging.getLogger(__name__)

ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
COST_PER_EXPORT = 10
COST_PER_CHUNK = 100
# Answers that mean the patch will never be allowed or has no pod to change: the feature turns itself off.
REFUSALS = (401, 403, 404)


def deletion_cost(exports: int, chunks: int) -> int:
    """The annotation's value for a worker running ``exports`` exports and ``chunks`` chunks."""
    return exports * COST_PER_EXPORT + chunks * COST_PER_CHUNK


async def keep_deletion_cost(
    settings: KubernetesSettings, held: Callable[[], tuple[int, int]], *, stop: asyncio.Event
) -> None:
    """Until ``stop`` is set, every ``pod_deletion_cost_interval_seconds``, patch the pod's annotation to
    ``deletion_cost(*held())`` when it changed; return at once when ``kubernetes_pod_name`` is unset, and when
    the API refuses (``REFUSALS``). Another failure is logged and tried again at the next interval.
    """
    if not settings.kubernetes_pod_name:
        return
    folder = Path(settings.kubernetes_service_account_dir)
    try:
        namespace = settings.kubernetes_namespace or (folder / "namespace").read_text().strip()
    except OSError:
        log.warning("pod deletion cost off: no namespace given or mounted", extra={"folder": str(folder)})
        return
    url = f"{settings.kubernetes_api_url.rstrip('/')}/api/v1/namespaces/{namespace}/pods/{settings.kubernetes_pod_name}"
    ca = folder / "ca.crt"
    context = ssl.create_default_context(cafile=str(ca)) if ca.exists() else None
    sent: int | None = None
    timeout = aiohttp.ClientTimeout(total=settings.pod_deletion_cost_interval_seconds)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while True:
            cost = deletion_cost(*held())
            if cost != sent:
                status = await _patch(session, url, folder / "token", cost, context)
                if status in REFUSALS:
                    log.warning("pod deletion cost off: the Kubernetes API refused the patch", extra={"status": status})
                    return
                if status is not None and status < 300:
                    sent = cost
            if await sleep_unless_stopped(stop, settings.pod_deletion_cost_interval_seconds):
                return


async def _patch(
    session: aiohttp.ClientSession, url: str, token_file: Path, cost: int, context: ssl.SSLContext | None
) -> int | None:
    """PATCH the annotation (a JSON merge patch); the answer's status, or None when there was none."""
    body = json.dumps({"metadata": {"annotations": {ANNOTATION: str(cost)}}})
    # The token is read each time (a small local file): the kubelet rotates projected service account tokens.
    token = token_file.read_text().strip()  # noqa: ASYNC240
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/merge-patch+json"}
    try:
        async with session.patch(url, data=body, headers=headers, ssl=context if context else True) as response:
            return response.status
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        log.warning("pod deletion cost not updated", extra={"error": type(exc).__name__})
        return None
