"""The interactive API reference at ``/v3/docs``: Swagger UI, from the ``swagger-ui-bundle`` package, rendering
the API's own OpenAPI document (``/v3/openapi.json``), every file served from the API's own origin with a strict
Content-Security-Policy. Like the web page at ``/ui``, the page holds no secret: a token typed into Swagger UI's
"Authorize" stays in the page's memory and is sent only in the ``Authorization`` header. The Swagger UI that
swagger-ui-bundle ships (4.15.5) renders OpenAPI 3.0 only: the page's script hands it the document labelled
3.0.3, and says what that leaves out (services/api/docs/docs.js).
"""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable

from aiohttp import web
from aiohttp.typedefs import Handler
from swagger_ui_bundle import swagger_ui_path

from services.api.views import page

# The web page's policy (services.api.views.page), scripts named, and one addition. Scripts are this origin's files
# only: no inline script and no eval (Swagger UI's bundle calls ``Function("return this")`` only where neither
# ``globalThis``, ``window`` nor ``self`` exists, never in a browser). ``img-src data:``: swagger-ui.css draws
# its icons as ``data:`` SVG images. Styles stay this origin's too: Swagger UI sets its inline styles through
# the DOM (``element.style``), which a policy does not refuse, and writes no ``<style>`` element or ``style``
# attribute in markup, so ``style-src 'unsafe-inline'`` is not needed (the browser test fails on any
# violation of this policy).
CONTENT_SECURITY_POLICY = f"{page.CONTENT_SECURITY_POLICY}; script-src 'self'; img-src 'self' data:"
HEADERS = page.HEADERS | {"Content-Security-Policy": CONTENT_SECURITY_POLICY}

_OURS = resources.files("services.api") / "docs"
# Route name (shared.routes) -> (file, media type): the allow-list of what the page serves. Each route is one
# literal path, so a request names a route, never a file, and no path reaches the file system. Of Swagger UI's
# files only the bundle and its style sheet: the page uses its default layout, without the standalone preset.
FILES: dict[str, tuple[Traversable, str]] = {
    "docsPage": (_OURS / "index.html", "text/html"),
    "docsScript": (_OURS / "docs.js", "text/javascript"),
    "docsSwaggerScript": (swagger_ui_path / "swagger-ui-bundle.js", "text/javascript"),
    "docsSwaggerStyle": (swagger_ui_path / "swagger-ui.css", "text/css"),
}

CONTENTS = {name: (file.read_bytes(), media_type) for name, (file, media_type) in FILES.items()}


async def docs_file(request: web.Request) -> web.Response:
    """``GET /v3/docs`` and its files ``/v3/docs/docs.js``, ``/v3/docs/swagger-ui-bundle.js`` and
    ``/v3/docs/swagger-ui.css``: the file of the route that matched (``FILES``), read once at start. Bound only
    to the routes ``FILES`` names (services.api.routes); any other path under ``/v3/docs/`` matches no route and
    answers 404 (401 without a token, like every unknown path under ``/v3``).
    """
    body, media_type = CONTENTS[str(request.match_info.route.name)]
    return web.Response(body=body, content_type=media_type, charset="utf-8", headers=HEADERS)


# Route name (shared.routes) -> handler, for the route table (services.api.routes): one per file served.
HANDLERS: dict[str, Handler] = dict.fromkeys(FILES, docs_file)
