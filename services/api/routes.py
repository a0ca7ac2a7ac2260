"""The route table of the public and admin API."""

from __future__ import annotations

from aiohttp import web

from services.api.openapi import EVENTS_PATH, OPENAPI_PATH
from services.api.views import admin, docs, exports, health, messages, operations, page, webhooks


def setup_routes(app: web.Application) -> None:
    """Register every route; unknown paths answer 404 and wrong methods 405 with ``Allow``."""
    router = app.router
    router.add_get("/healthz", health.healthz)
    router.add_get("/readyz", health.readyz)

    router.add_get("/v2/conversations", messages.list_conversations)
    router.add_post("/v2/conversations/{cid}/messages", messages.send_message)
    router.add_get("/v2/conversations/{cid}/messages", messages.read_messages)
    router.add_delete("/v2/conversations/{cid}/messages/{message_id:[^/]+}", messages.recall_message)

    router.add_post("/v3/conversations/{cid}/exports", exports.submit_export)
    router.add_get("/v3/exports/{operation_id}/result", exports.download_result)
    router.add_get("/v3/exports/{operation_id}/result/parts/{number}", exports.download_part)
    router.add_get("/v3/operations", operations.list_operations)
    router.add_get("/v3/operations/{operation_id}", operations.get_operation)
    router.add_get(EVENTS_PATH, operations.stream_operation_events, allow_head=False)
    router.add_post("/v3/operations/{operation_id}/cancel", operations.cancel_operation)
    router.add_get("/v3/webhooks/secret", webhooks.webhook_secret)
    router.add_get(OPENAPI_PATH, docs.openapi_document)
    router.add_get("/ui", page.to_page)
    router.add_get(page.PAGE_ROUTE, page.page_file)

    router.add_put("/admin/conversations/{cid}", admin.put_conversation)
    router.add_get("/admin/conversations/{cid}", admin.get_conversation)
    router.add_put("/admin/conversations/{cid}/members/{uid}", admin.add_member)
    router.add_delete("/admin/conversations/{cid}/members/{uid}", admin.remove_member)
    router.add_post("/admin/conversations/{cid}/messages:import", admin.import_messages)
    router.add_get("/admin/operations", admin.list_operations)
    router.add_get("/admin/operations/{operation_id}", admin.get_operation)
    router.add_post("/admin/operations/{operation_id}/requeue", admin.requeue_operation)
