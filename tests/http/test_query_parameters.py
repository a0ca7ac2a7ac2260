"""A request's query string against its model (``services.api.http.bodies.validate_query``): a request without
one shares the model's defaults, validated once, and a model that needs a parameter still refuses it.
"""

from __future__ import annotations

import inspect

import pytest
from aiohttp.test_utils import make_mocked_request
from pydantic import BaseModel

from services.api.http import schemas
from services.api.http.bodies import validate_query
from services.api.http.problems import ProblemError
from services.api.http.schemas import AttachmentUploadQuery, OperationQuery

QUERY_MODELS = [
    model
    for name, model in inspect.getmembers(schemas, inspect.isclass)
    if issubclass(model, BaseModel) and name.endswith("Query")
]


def test_every_query_model_is_frozen() -> None:
    # The defaults of a request without parameters are one instance shared by every such request.
    assert QUERY_MODELS
    assert [model.__name__ for model in QUERY_MODELS if not model.model_config.get("frozen")] == []


def test_no_query_string_gives_the_defaults_once() -> None:
    first = validate_query(OperationQuery, make_mocked_request("GET", "/v3/operations/op_1"))
    second = validate_query(OperationQuery, make_mocked_request("GET", "/v3/operations/op_2"))
    assert first == OperationQuery.model_validate({})
    assert second is first


def test_a_parameter_still_counts() -> None:
    query = validate_query(OperationQuery, make_mocked_request("GET", "/v3/operations/op_1?wait=5"))
    assert query.wait == 5


@pytest.mark.parametrize("attempt", [1, 2])
def test_a_required_parameter_left_out_is_refused_every_time(attempt: int) -> None:
    request = make_mocked_request("POST", "/v2/conversations/c/attachments")
    with pytest.raises(ProblemError) as refused:
        validate_query(AttachmentUploadQuery, request)
    assert refused.value.status == 422, attempt
    assert refused.value.extra["errors"][0]["loc"] == ["query", "name"]
