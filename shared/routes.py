"""Every route of the API as plain data: its name, method and path template, each written once (docs/api.md: API
reference).

The API's router (``services.api.routes``) and the OpenAPI document's paths (``services.api.openapi``) are
both built from ``ROUTES``, and the operation representation's links (``shared.representation``) come from
``path``. The table lives in ``shared/`` because the relay renders representations for completion callbacks
and ``shared/`` imports no part.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shared.rate_policies import PolicyName

# A ``{name:regex}`` parameter of an aiohttp template; the regex only narrows what the router matches.
_CONSTRAINED = re.compile(r"\{(\w+):[^{}]*(?:\{[^{}]*\}[^{}]*)*\}")
_PARAMETER = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True)
class Route:
    """One route. ``name`` is unique: aiohttp's route name, the key its handler is bound by and, for a
    documented route, the OpenAPI ``operationId``. ``template`` is aiohttp's path template, where
    ``{name:regex}`` constrains a parameter. A GET route also answers HEAD unless ``head`` is False (an event
    stream: its headers would wait for the end of the stream). A ``public`` route answers without a token
    (docs/api.md: API reference): the probes, the web page, the API reference page and the OpenAPI document. A
    ``page`` route serves a page for browsers or one of its files (the web page at ``/ui``, the API reference at
    ``/v3/docs``): it describes no operation of the API, so it is never in the OpenAPI document, even under
    ``/v3``. ``summary`` says what a route the OpenAPI document leaves out does, for the endpoint table of
    docs/api.md (a documented route's summary is its ``Endpoint``'s, beside its view). ``policy`` is the rate
    limit each call by a user counts against (docs/api.md: Rate limits).
    """

    name: str
    method: str
    template: str
    head: bool = True
    public: bool = False
    page: bool = False
    summary: str = ""
    policy: PolicyName | None = None

    @property
    def path(self) -> str:
        """The template with plain ``{name}`` parameters, as OpenAPI writes it."""
        return _CONSTRAINED.sub(r"{\1}", self.template)

    @property
    def parameters(self) -> tuple[str, ...]:
        """The names of the path's parameters, in order."""
        return tuple(_PARAMETER.findall(self.path))

    @property
    def documented(self) -> bool:
        """True for the ``/v2`` and ``/v3`` routes but the pages', which the OpenAPI document describes; the
        ``/admin`` routes are operator tooling, the others probes and the web page (docs/api.md: API reference).
        """
        return self.template.startswith(("/v2/", "/v3/")) and not self.page


ROUTES: tuple[Route, ...] = (
    Route("healthz", "GET", "/healthz", public=True, summary="liveness"),
    Route("readyz", "GET", "/readyz", public=True, summary="readiness (the database and S3 answer)"),
    Route("listConversations", "GET", "/v2/conversations"),
    Route("sendMessage", "POST", "/v2/conversations/{cid}/messages"),
    Route("readMessages", "GET", "/v2/conversations/{cid}/messages"),
    Route("uploadAttachment", "POST", "/v2/conversations/{cid}/attachments"),
    Route("getAttachment", "GET", "/v2/conversations/{cid}/attachments/{attachment_id:[^/]+}"),
    Route("editMessage", "PATCH", "/v2/conversations/{cid}/messages/{message_id:[^/]+}"),
    Route("recallMessage", "DELETE", "/v2/conversations/{cid}/messages/{message_id:[^/]+}"),
    Route("submitExport", "POST", "/v3/conversations/{cid}/exports", policy=PolicyName.SUBMITS),
    Route("downloadResult", "GET", "/v3/exports/{operation_id}/result", policy=PolicyName.DOWNLOADS),
    Route("downloadResultPart", "GET", "/v3/exports/{operation_id}/result/parts/{number}", policy=PolicyName.DOWNLOADS),
    Route("listOperations", "GET", "/v3/operations", policy=PolicyName.POLLS),
    Route("getOperation", "GET", "/v3/operations/{operation_id}", policy=PolicyName.POLLS),
    Route("streamOperationEvents", "GET", "/v3/operations/{operation_id}/events", head=False, policy=PolicyName.POLLS),
    Route("getLimits", "GET", "/v3/limits", policy=PolicyName.POLLS),
    Route("cancelOperation", "POST", "/v3/operations/{operation_id}/cancel"),
    Route("getWebhookSecret", "GET", "/v3/webhooks/secret"),
    Route("createExportSchedule", "POST", "/v3/conversations/{cid}/export-schedules"),
    Route("listExportSchedules", "GET", "/v3/export-schedules"),
    Route("getExportSchedule", "GET", "/v3/export-schedules/{schedule_id}"),
    Route("deleteExportSchedule", "DELETE", "/v3/export-schedules/{schedule_id}"),
    Route("listExportScheduleRuns", "GET", "/v3/export-schedules/{schedule_id}/runs"),
    Route("pauseExportSchedule", "POST", "/v3/export-schedules/{schedule_id}/pause"),
    Route("resumeExportSchedule", "POST", "/v3/export-schedules/{schedule_id}/resume"),
    Route("getOpenApiDocument", "GET", "/v3/openapi.json", public=True),
    Route("toPage", "GET", "/ui", public=True, page=True, summary="redirects to the web page, `/ui/`"),
    Route(
        "pageFile",
        "GET",
        "/ui/{name:(|page\\.js|page\\.css)}",
        public=True,
        page=True,
        summary="the web page (`/ui/`), its script (`page.js`) and its style sheet (`page.css`)",
    ),
    # The API reference and its files, one literal path each: a public path under /v3 is let through by the
    # request middleware only as it is written (services.api.http.middlewares.PUBLIC_PATHS).
    Route("docsPage", "GET", "/v3/docs", public=True, page=True, summary="the interactive API reference (Swagger UI)"),
    Route("docsScript", "GET", "/v3/docs/docs.js", public=True, page=True, summary="the API reference's own script"),
    Route(
        "docsSwaggerScript", "GET", "/v3/docs/swagger-ui-bundle.js", public=True, page=True, summary="Swagger UI itself"
    ),
    Route("docsSwaggerStyle", "GET", "/v3/docs/swagger-ui.css", public=True, page=True, summary="Swagger UI's styles"),
    Route(
        "adminPutConversation",
        "PUT",
        "/admin/conversations/{cid}",
        summary='create the conversation or replace its members (`{"members": [...]}`)',
    ),
    Route(
        "adminGetConversation",
        "GET",
        "/admin/conversations/{cid}",
        summary="the conversation: sorted members, last seq, count of messages not recalled",
    ),
    Route("adminAddMember", "PUT", "/admin/conversations/{cid}/members/{uid}", summary="add one member (204)"),
    Route("adminRemoveMember", "DELETE", "/admin/conversations/{cid}/members/{uid}", summary="remove one member (204)"),
    Route("adminImportMessages", "POST", "/admin/conversations/{cid}/messages:import", summary="import NDJSON history"),
    Route(
        "adminListOperations",
        "GET",
        "/admin/operations",
        summary="every user's operations, newest first (find the FAILED_REPAIR ones)",
    ),
    Route(
        "adminGetOperation",
        "GET",
        "/admin/operations/{operation_id}",
        summary="any operation with its attempts, artifacts and access events",
    ),
    Route(
        "adminRequeueOperation",
        "POST",
        "/admin/operations/{operation_id}/requeue",
        summary="put a FAILED_REPAIR operation back to QUEUED",
    ),
)

ROUTES_BY_NAME: dict[str, Route] = {route.name: route for route in ROUTES}
_PATHS = {route.name: route.path for route in ROUTES}


def path(route: str, /, **parameters: str | int) -> str:
    """The path of the route named ``route`` with ``parameters`` filled in as they are (the callers pass
    URL-safe ids): ``path("getOperation", operation_id="op_1")`` is ``/v3/operations/op_1``. Raises ``KeyError``
    for an unknown route or a missing parameter.
    """
    return _PATHS[route].format_map(parameters)
