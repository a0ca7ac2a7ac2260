"""The web page at ``/ui/``: three static files, sent with a strict Content-Security-Policy (docs/api.md: Web page). The
page holds no secret: it asks for a token and calls the API like any client.
"""

from __future__ import annotations

from importlib import resources

from aiohttp import web
from aiohttp.typedefs import Handler

from shared.routes import path

# Only this origin's own files and fetches; no inline script or style, no framing, no form posts.
CONTENT_SECURITY_POLICY = "default-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
# Path under /ui/ -> (file of services/api/page, media type); the route's template (shared.routes) names the same.
FILES = {
    "": ("index.html", "text/html"),
    "page.js": ("page.js", "text/javascript"),
    "page.css": ("page.css", "text/css"),
}


def _read(name: str) -> bytes:
    return (resources.files("services.api") / "page" / name).read_bytes()


CONTENTS = {path: (_read(name), media_type) for path, (name, media_type) in FILES.items()}


async def page_file(request: web.Request) -> web.Response:
    """``GET /ui/``, ``/ui/page.js``, ``/ui/page.css``: the page's files, read once at start."""
    body, media_type = CONTENTS[request.match_info["name"]]
    return web.Response(body=body, content_type=media_type, charset="utf-8", headers=HEADERS)


async def to_page(request: web.Request) -> web.Response:
    """``GET /ui``: to ``/ui/``, where the page's relative links resolve."""
    raise web.HTTPPermanentRedirect(path("pageFile", name=""))


# Route name (shared.routes) -> handler, for the route table (services.api.routes).
HANDLERS: dict[str, Handler] = {"toPage": to_page, "pageFile": page_file}
