"""The worker's pod deletion cost (docs/kubernetes.md: Stopping and scaling down), against a stand-in for the
Kubernetes API on 127.0.0.1 that records the patches it gets."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from services.worker.deletion_cost import ANNOTATION, deletion_cost, keep_deletion_cost
from shared.settings import Settings
from tests.support import wait_for


class KubernetesApi:
    """Answers PATCH of a pod with ``status`` and records each (path, Authorization, content type, body)."""

    def __init__(self) -> None:
        self.status = 200
        self.patches: list[tuple[str, str, str, dict[str, Any]]] = []
        self.url = ""

    async def patch(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        self.patches.append((request.path, request.headers["Authorization"], request.content_type, body))
        return web.json_response({}, status=self.status)

    def costs(self) -> list[str]:
        return [body["metadata"]["annotations"][ANNOTATION] for _, _, _, body in self.patches]


@pytest.fixture
async def kubernetes() -> AsyncIterator[KubernetesApi]:
    api = KubernetesApi()
    app = web.Application()
    app.router.add_patch("/api/v1/namespaces/{namespace}/pods/{pod}", api.patch)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    api.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield api
    await runner.cleanup()


def settings_for(api: KubernetesApi, folder: Path) -> Settings:
    (folder / "token").write_text("service-account-token\n")
    return Settings(
        kubernetes_pod_name="chatexport-worker-7d9f",
        kubernetes_namespace="chatexport",
        kubernetes_api_url=api.url,
        kubernetes_service_account_dir=str(folder),
        pod_deletion_cost_interval_seconds=0.05,
    )


def test_an_idle_worker_costs_nothing_and_a_chunk_more_than_an_export() -> None:
    assert deletion_cost(0, 0) == 0
    assert 0 < deletion_cost(1, 0) < deletion_cost(0, 1)


async def test_the_annotation_follows_what_the_worker_holds(kubernetes: KubernetesApi, tmp_path: Path) -> None:
    held = [0, 0]
    stop = asyncio.Event()
    keeping = asyncio.create_task(
        keep_deletion_cost(settings_for(kubernetes, tmp_path), lambda: (held[0], held[1]), stop=stop)
    )
    await wait_for(lambda: kubernetes.costs() == ["0"])
    held[:] = [2, 1]
    await wait_for(lambda: kubernetes.costs() == ["0", str(deletion_cost(2, 1))])
    held[:] = [0, 0]
    await wait_for(lambda: kubernetes.costs()[-1:] == ["0"])
    stop.set()
    await asyncio.wait_for(keeping, 5)
    assert len(kubernetes.costs()) == 3  # a patch only when the cost changed
    path, authorization, content_type, _ = kubernetes.patches[0]
    assert path == "/api/v1/namespaces/chatexport/pods/chatexport-worker-7d9f"
    assert (authorization, content_type) == ("Bearer service-account-token", "application/merge-patch+json")


async def test_without_rbac_the_feature_turns_itself_off(kubernetes: KubernetesApi, tmp_path: Path) -> None:
    kubernetes.status = 403
    held = [1, 0]
    stop = asyncio.Event()
    await asyncio.wait_for(
        keep_deletion_cost(settings_for(kubernetes, tmp_path), lambda: (held[0], held[1]), stop=stop), 5
    )
    assert len(kubernetes.patches) == 1


async def test_off_without_a_pod_name(kubernetes: KubernetesApi, tmp_path: Path) -> None:
    settings = settings_for(kubernetes, tmp_path).model_copy(update={"kubernetes_pod_name": None})
    await asyncio.wait_for(keep_deletion_cost(settings, lambda: (1, 1), stop=asyncio.Event()), 5)
    assert kubernetes.patches == []
