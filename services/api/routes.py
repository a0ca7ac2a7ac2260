"""The API's router: each route of ``shared.routes.ROUTES`` bound to its handler by name."""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler

from services.api.http import openapi
from services.api.views import admin, docs, exports, health, messages, operations, page, schedules, webhooks
from shared.routes import ROUTES

HANDLERS: dict[str, Handler] = {
    "healthz": health.healthz,
    "readyz": health.readyz,
    "listConversations": messages.list_conversations,
    "sendMessage": messages.send_message,
    "readMessages": messages.read_messages,
    "recallMessage": messages.recall_message,
    "submitExport": exports.submit_export,
    "downloadResult": exports.download_result,
    "downloadResultPart": exports.download_part,
    "listOperations": operations.list_operations,
    "getOperation": operations.get_operation,
    "streamOperationEvents": operations.stream_operation_events,
    "cancelOperation": operations.cancel_operation,
    "getWebhookSecret": webhooks.webhook_secret,
    "createExportSchedule": schedules.create_export_schedule,
    "listExportSchedules": schedules.list_export_schedules,
    "getExportSchedule": schedules.get_export_schedule,
    "deleteExportSchedule": schedules.delete_export_schedule,
    "listExportScheduleRuns": schedules.list_export_schedule_runs,
    "pauseExportSchedule": schedules.pause_export_schedule,
    "resumeExportSchedule": schedules.resume_export_schedule,
    "getOpenApiDocument": openapi.openapi_document,
    "toPage": page.to_page,
    "pageFile": page.page_file,
    "docsPage": docs.docs_file,
    "docsScript": docs.docs_file,
    "docsSwaggerScript": docs.docs_file,
    "docsSwaggerStyle": docs.docs_file,
    "adminPutConversation": admin.put_conversation,
    "adminGetConversation": admin.get_conversation,
    "adminAddMember": admin.add_member,
    "adminRemoveMember": admin.remove_member,
    "adminImportMessages": admin.import_messages,
    "adminListOperations": admin.list_operations,
    "adminGetOperation": admin.get_operation,
    "adminRequeueOperation": admin.requeue_operation,
}


def setup_routes(app: web.Application) -> None:
    """Register every route under its name; unknown paths answer 404 and wrong methods 405 with ``Allow``.
    Raises ``KeyError`` for a route without a handler.
    """
    for route in ROUTES:
        handler = HANDLERS[route.name]
        if route.method == "GET":
            app.router.add_get(route.template, handler, name=route.name, allow_head=route.head)
        else:
            app.router.add_route(route.method, route.template, handler, name=route.name)
