"""The OpenAPI document: valid OpenAPI 3.1, true to the router, generated from the pydantic models."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from openapi_spec_validator import OpenAPIV31SpecValidator
from pydantic import BaseModel

from services.api.http import schemas
from services.api.http.contract import REF_TEMPLATE
from services.api.http.keys import VERIFIER
from services.api.http.middlewares import request_middleware
from services.api.http.problems import CODES, PROBLEM_CONTENT_TYPE
from services.api.openapi import MODELS, build_document, document_bytes
from services.api.routes import setup_routes
from shared.auth import TokenVerifier
from shared.routes import ROUTES_BY_NAME
from shared.settings import Settings

DOCUMENT = build_document()
OPENAPI_PATH = ROUTES_BY_NAME["getOpenApiDocument"].path
EVENTS_PATH = ROUTES_BY_NAME["streamOperationEvents"].path
PUBLIC_PREFIXES = ("/v2/", "/v3/")


def router_operations() -> set[tuple[str, str]]:
    """(method, path template) of every /v2 and /v3 route, with the HEAD aiohttp adds to each GET, but the
    pages' (the API reference at /v3/docs and its files), which describe no operation.
    """
    app = web.Application()
    setup_routes(app)
    return {
        (route.method.lower(), route.resource.canonical)
        for route in app.router.routes()
        if route.resource is not None
        and route.resource.canonical.startswith(PUBLIC_PREFIXES)
        and not ROUTES_BY_NAME[str(route.resource.name)].page
    }


def documented_operations() -> set[tuple[str, str]]:
    return {
        (method, path)
        for path, item in DOCUMENT["paths"].items()
        for method in item
        if method in ("get", "put", "post", "delete", "patch", "head", "options")
    }


def walk(node: Any) -> Iterator[dict[str, Any]]:
    """Every object in a JSON document, depth first."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)


def test_the_document_is_valid_openapi_3_1() -> None:
    assert DOCUMENT["openapi"].startswith("3.1.")
    errors = [error.message for error in OpenAPIV31SpecValidator(DOCUMENT).iter_errors()]
    assert errors == []


def test_every_public_route_is_documented_with_its_methods_and_nothing_else() -> None:
    assert router_operations() == documented_operations()
    assert ("get", OPENAPI_PATH) in router_operations()


def test_every_reference_names_a_component() -> None:
    references = {node["$ref"] for node in walk(DOCUMENT) if "$ref" in node}
    names = {REF_TEMPLATE.format(model=name) for name in DOCUMENT["components"]["schemas"]}
    assert references and references <= names


@pytest.mark.parametrize(("model", "mode"), MODELS, ids=[model.__name__ for model, _ in MODELS])
def test_component_schemas_are_the_models_json_schemas(model: type[BaseModel], mode: Any) -> None:
    generated = model.model_json_schema(ref_template=REF_TEMPLATE, mode=mode)
    nested = generated.pop("$defs", {})
    components = DOCUMENT["components"]["schemas"]
    assert components[model.__name__] == generated
    assert all(components[name] == schema for name, schema in nested.items())


def response_schema(path: str, method: str, status: str, media_type: str) -> Any:
    return DOCUMENT["paths"][path][method]["responses"][status]["content"][media_type]["schema"]


def test_responses_reference_the_response_models() -> None:
    operation = "/v3/operations/{operation_id}"
    assert response_schema(operation, "get", "200", "application/json") == {"$ref": "#/components/schemas/Operation"}
    assert response_schema("/v3/operations", "get", "200", "application/json")["$ref"].endswith("/OperationPage")
    assert response_schema("/v2/conversations/{cid}/messages", "get", "200", "application/json")["$ref"].endswith(
        "/MessagePage"
    )
    operation_fields = DOCUMENT["components"]["schemas"]["Operation"]["properties"]
    assert set(operation_fields) == {field.alias or name for name, field in schemas.Operation.model_fields.items()}


def test_a_changed_model_changes_the_document(monkeypatch: pytest.MonkeyPatch) -> None:
    class RecalledMessage(schemas.RecalledMessage):
        """A recall answer with one more member."""

        recalled_at: str

    changed = [(RecalledMessage if model is schemas.RecalledMessage else model, mode) for model, mode in MODELS]
    monkeypatch.setattr("services.api.openapi.MODELS", tuple(changed))
    recall = "/v2/conversations/{cid}/messages/{message_id}"
    document = build_document()
    assert (
        document["paths"][recall]["delete"]["responses"]["200"]
        == DOCUMENT["paths"][recall]["delete"]["responses"]["200"]
    )
    assert "recalled_at" in document["components"]["schemas"]["RecalledMessage"]["properties"]
    assert "recalled_at" not in DOCUMENT["components"]["schemas"]["RecalledMessage"]["properties"]


def test_errors_are_problems_with_codes_of_their_status() -> None:
    for path, item in DOCUMENT["paths"].items():
        for method, operation in item.items():
            if method in ("parameters", "head") or path == OPENAPI_PATH:
                continue
            errors = {status: response for status, response in operation["responses"].items() if status >= "400"}
            assert {"401", "500", "503"} <= set(errors), (method, path)
            for status, response in errors.items():
                schema = response["content"][PROBLEM_CONTENT_TYPE]["schema"]
                assert schema["$ref"] == "#/components/schemas/Problem"
                assert {CODES[code][0] for code in schema["properties"]["code"]["enum"]} == {int(status)}


def test_head_answers_as_get_without_bodies() -> None:
    for path, item in DOCUMENT["paths"].items():
        if "get" not in item or path == EVENTS_PATH:
            continue
        get, head = item["get"]["responses"], item["head"]["responses"]
        assert set(head) == set(get)
        assert all("content" not in response for response in head.values())
        assert all(head[status].get("headers") == response.get("headers") for status, response in get.items())


def test_the_event_stream_has_no_head_and_streams_events() -> None:
    events = DOCUMENT["paths"][EVENTS_PATH]
    assert set(events) == {"parameters", "get"}
    assert list(events["get"]["responses"]["200"]["content"]) == ["text/event-stream"]


def test_submit_documents_its_headers() -> None:
    submit = DOCUMENT["paths"]["/v3/conversations/{cid}/exports"]["post"]
    assert any(p["name"] == "Idempotency-Key" and p["required"] for p in submit["parameters"])
    assert set(submit["responses"]["202"]["headers"]) == {
        "Location",
        "Cache-Control",
        "ETag",
        "Retry-After",
        "Idempotent-Replayed",
        "RateLimit-Policy",
        "RateLimit",
    }
    assert submit["responses"]["429"]["headers"]["Retry-After"]["required"]
    download = DOCUMENT["paths"]["/v3/exports/{operation_id}/result"]["get"]["responses"]
    assert "application/x-ndjson" in download["206"]["content"]
    assert {"Content-Range", "ETag", "Content-Length"} <= set(download["206"]["headers"])


@pytest.fixture
async def client() -> AsyncIterator[TestClient[Any, Any]]:
    """The API's middlewares and routes without its database: enough for the document and for 401s."""
    app = web.Application(middlewares=[request_middleware])
    app[VERIFIER] = TokenVerifier(Settings())
    setup_routes(app)
    async with TestClient(TestServer(app)) as test_client:
        yield test_client


async def test_the_document_is_served_without_a_token(client: TestClient[Any, Any]) -> None:
    response = await client.get(OPENAPI_PATH)
    assert response.status == 200
    assert response.content_type == "application/json"
    assert await response.read() == document_bytes()
    assert json.loads(document_bytes()) == DOCUMENT


@pytest.mark.parametrize("path", [f"{OPENAPI_PATH}x", "/v3/openapi.json/", "/v3/operations"])
async def test_only_the_document_is_let_through(client: TestClient[Any, Any], path: str) -> None:
    response = await client.get(path)
    assert response.status == 401
