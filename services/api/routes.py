"""The API's router: each route of ``shared.routes.ROUTES`` bound by name to the handler its view module
exports, with the route's ``Endpoint`` for the documented routes (``ENDPOINTS``) or in ``HANDLERS`` for the others.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler

from services.api.http.keys import OPENAPI_DOCUMENT
from services.api.openapi import ENDPOINTS, document_bytes
from services.api.views import admin, docs, health, page
from shared.routes import ROUTES

HANDLERS: dict[str, Handler] = {
    **{name: endpoint.handler for name, endpoint in ENDPOINTS.items()},
    **health.HANDLERS,
    **page.HANDLERS,
    **docs.HANDLERS,
    **admin.HANDLERS,
}


def setup_routes(app: web.Application) -> None:
    """Register every route under its name, and the OpenAPI document ``getOpenApiDocument`` serves; unknown
    paths answer 404 and wrong methods 405 with ``Allow``. Raises ``LookupError`` when the handlers and the route
    table name different routes.
    """
    unbound = {route.name for route in ROUTES} ^ set(HANDLERS)
    if unbound:
        raise LookupError(f"routes without a handler, or handlers without a route: {sorted(unbound)}")
    app[OPENAPI_DOCUMENT] = document_bytes()
    for route in ROUTES:
        handler = HANDLERS[route.name]
        if route.method == "GET":
            app.router.add_get(route.template, handler, name=route.name, allow_head=route.head)
        else:
            app.router.add_route(route.method, route.template, handler, name=route.name)
