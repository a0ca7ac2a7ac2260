"""The route table (``shared.routes``) is the one list of routes: the router, the OpenAPI endpoints and the
handlers all name the same ones, and paths are built from it (docs/api.md: API reference). Every route that
needs a token refuses a query parameter it does not take (docs/api.md: API reference, Read).
"""

from __future__ import annotations

import re

import pytest
from aiohttp import web

from services.api.http.middlewares import PROTECTED_PREFIXES
from services.api.openapi import ENDPOINTS
from services.api.routes import HANDLERS, setup_routes
from services.api.views.page import FILES
from shared.routes import ROUTES, ROUTES_BY_NAME, Route, path
from tests.support.api_calls import expect_problem
from tests.support.exports import GUESSED_ID, Auth, Client

pytestmark = pytest.mark.module_database

# A value of each path parameter with the shape the route's view accepts: the query is judged first.
PATH_VALUES = {
    "cid": "c-a",
    "uid": "bob",
    "message_id": "m-1",
    "operation_id": GUESSED_ID,
    "number": "1",
    "schedule_id": "sch_AAAAAAAAAAAAAAAAAAAAAAAA",
    "attachment_id": "att_AAAAAAAAAAAAAAAAAAAAAAAA",
}
# The query parameters a route requires, so that the unknown one is the only thing wrong.
REQUIRED_QUERY = {"uploadAttachment": {"name": "a.txt"}}


def test_every_route_has_one_name_and_one_handler() -> None:
    assert len(ROUTES_BY_NAME) == len(ROUTES)
    assert set(HANDLERS) == set(ROUTES_BY_NAME)


def test_the_router_answers_each_route_under_its_name() -> None:
    app = web.Application()
    setup_routes(app)
    for route in ROUTES:
        resource = app.router[route.name]
        assert resource.canonical == route.path
        methods = {added.method for added in resource}
        assert methods == {route.method, *(["HEAD"] if route.method == "GET" and route.head else [])}


def test_every_documented_route_and_only_those_has_an_endpoint() -> None:
    assert set(ENDPOINTS) == {route.name for route in ROUTES if route.documented}


def test_a_route_the_openapi_document_leaves_out_and_only_such_a_route_has_a_summary_of_its_own() -> None:
    # The endpoint table of docs/api.md shows a documented route's Endpoint summary, any other route's own.
    assert [route.name for route in ROUTES if bool(route.summary) == route.documented] == []


def test_public_routes_under_a_protected_prefix_have_literal_paths() -> None:
    # The request middleware compares the request's path with theirs as it is.
    protected = [route for route in ROUTES if route.public and route.path.startswith(PROTECTED_PREFIXES)]
    assert protected and all(not route.parameters for route in protected)


def test_paths_are_filled_in_from_the_templates() -> None:
    assert path("getOperation", operation_id="op_1") == "/v3/operations/op_1"
    assert path("downloadResultPart", operation_id="op_1", number=2) == "/v3/exports/op_1/result/parts/2"
    assert path("recallMessage", cid="c-a", message_id="m-1") == "/v2/conversations/c-a/messages/m-1"
    assert ROUTES_BY_NAME["recallMessage"].parameters == ("cid", "message_id")


def test_the_page_route_matches_exactly_the_page_files() -> None:
    template = ROUTES_BY_NAME["pageFile"].template
    pattern = re.fullmatch(r"/ui/\{name:(.*)\}", template)
    assert pattern is not None
    candidates = [*FILES, "page.jsx", "index.html", "x"]
    assert {name for name in candidates if re.fullmatch(pattern.group(1), name)} == set(FILES)


@pytest.mark.parametrize("route", [route for route in ROUTES if not route.public], ids=lambda route: route.name)
async def test_every_route_that_needs_a_token_refuses_an_unknown_query_parameter(
    api: Client, auth: Auth, route: Route
) -> None:
    url = path(route.name, **{name: PATH_VALUES[name] for name in route.parameters})
    params = {**REQUIRED_QUERY.get(route.name, {}), "unknown": "1"}
    response = await api.request(route.method, url, params=params, headers=auth("root", admin=True))
    problem = await expect_problem(response, 422, "VALIDATION_FAILED", case=route.name)
    assert [error["loc"] for error in problem["errors"]] == [["query", "unknown"]]
