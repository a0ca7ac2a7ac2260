"""The live API against its own OpenAPI document: schemathesis generates requests from the document and sends
them to the end-to-end system; no answer may be a 5xx, and every answer must conform to the document (status
code, content type, body schema, headers).

Generated ids rarely name anything, so three cases in four are pointed at things that exist: a conversation
with messages, a SUCCEEDED export, and an export whose owner has since left the conversation. Each case is
sent with the token of the conversation's member, of an outsider, or an invalid one. The choices are a hash
of the case and generation is derandomized, so a run is repeatable.
"""

from __future__ import annotations

import json
import urllib.request
import zlib
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import schemathesis
from schemathesis import checks

from devtools.localsystem import LocalSystem
from services.api.openapi import build_document
from shared.routes import path
from tests.support import unique
from tests.support.api_calls import Headers, import_lines, make_conversation, submit, wait_terminal

pytestmark = pytest.mark.e2e

OPENAPI_PATH = path("getOpenApiDocument")

CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
    checks.response_headers_conformance,
]
# Enough cases per operation to reach its documented answers, few enough for the run to take seconds.
MAX_EXAMPLES = 25
ACTORS = ("member", "member", "outsider", "invalid")


@dataclass(frozen=True)
class World:
    """What exists before the run: the values each path parameter may be aimed at, and each actor's headers."""

    targets: dict[str, tuple[str, ...]]
    headers: dict[str, dict[str, str]]


async def succeeded_export(api: aiohttp.ClientSession, auth: Headers, member: str, **options: Any) -> tuple[str, str]:
    """A new conversation of ``member`` alone with five messages, exported with ``options``: (conversation id,
    operation id).
    """
    cid = unique("oas-conversation")
    await make_conversation(api, auth, cid, [member])
    await import_lines(api, auth, cid, [{"message_id": f"m{n}", "sender_id": member, "body": f"{n}"} for n in range(5)])
    response = await submit(api, auth, member, cid, {"format": "jsonl", **options}, unique("key"))
    assert response.status == 202, await response.text()
    operation = await wait_terminal(api, auth, member, response.headers["Location"], timeout=60)
    assert operation["state"] == "SUCCEEDED", operation
    return cid, operation["operation_id"]


async def schedule(api: aiohttp.ClientSession, auth: Headers, member: str, cid: str) -> str:
    """A daily export schedule of ``cid`` by ``member``: its id."""
    response = await api.post(
        path("createExportSchedule", cid=cid),
        json={"every": "P1D"},
        headers={**auth(member), "Idempotency-Key": unique("key")},
    )
    assert response.status == 201, await response.text()
    schedule_id: str = (await response.json())["schedule_id"]
    return schedule_id


async def carried_attachment(api: aiohttp.ClientSession, auth: Headers, member: str, cid: str) -> str:
    """A file ``member`` uploaded to ``cid`` and sent in a message: its id."""
    response = await api.post(
        path("uploadAttachment", cid=cid), params={"name": "a.txt"}, data=b"a", headers=auth(member)
    )
    assert response.status == 201, await response.text()
    attachment_id: str = (await response.json())["attachment_id"]
    sent = await api.post(
        path("sendMessage", cid=cid),
        json={"message_id": unique("m"), "body": "a", "attachments": [attachment_id]},
        headers=auth(member),
    )
    assert sent.status == 200, await sent.text()
    return attachment_id


@pytest.fixture(scope="module")
async def world(system: LocalSystem, live_auth: Headers) -> World:
    """Two exported conversations of one member, who then leaves the second one, and a third exported in
    parts (one part: five messages are far below the part size); a schedule of each of the first two.

    Module-scoped: every generated case of every operation shares it (hypothesis refuses function scope).
    """
    member = unique("oas-member")
    auth = live_auth
    async with aiohttp.ClientSession(base_url=system.base_url) as api:
        cid, operation_id = await succeeded_export(api, auth, member)
        left_cid, revoked_operation_id = await succeeded_export(api, auth, member)
        _, split_operation_id = await succeeded_export(api, auth, member, max_part_bytes=5 * 1024 * 1024)
        schedule_ids = (await schedule(api, auth, member, cid), await schedule(api, auth, member, left_cid))
        attachment_id = await carried_attachment(api, auth, member, cid)
        response = await api.delete(
            f"/admin/conversations/{left_cid}/members/{member}", headers=auth("root", admin=True)
        )
        assert response.status == 204, await response.text()
    return World(
        targets={
            "cid": (cid,),
            "message_id": ("m4",),
            "operation_id": (operation_id, revoked_operation_id, split_operation_id),
            "number": ("1",),
            "schedule_id": schedule_ids,
            "attachment_id": (attachment_id,),
        },
        headers={
            "member": auth(member),
            "outsider": auth(unique("oas-outsider")),
            "invalid": {"Authorization": "Bearer not-a-token"},
        },
    )


# The document as built here; the first test proves that the live API serves exactly this one.
schema = schemathesis.openapi.from_dict(
    build_document(),
    config=schemathesis.Config.from_dict(
        {
            "generation": {"mode": "all", "max-examples": MAX_EXAMPLES, "deterministic": True, "database": "none"},
            "phases": {"stateful": {"enabled": False}},
        }
    ),
)


def test_the_api_serves_this_document(system: LocalSystem) -> None:
    with urllib.request.urlopen(f"{system.base_url}{OPENAPI_PATH}", timeout=10) as response:
        assert json.load(response) == schema.raw_schema


def aim(case: Any, world: World) -> dict[str, str]:
    """Point three cases in four at existing targets; return the headers of the actor chosen for the case."""
    choice = zlib.crc32(repr((case.method, case.path_parameters, case.query, case.headers, case.body)).encode())
    if choice % 4 and case.path_parameters:
        for name in case.path_parameters:
            targets = world.targets[name]
            case.path_parameters[name] = targets[choice // 16 % len(targets)]
    return world.headers[ACTORS[choice // 4 % len(ACTORS)]]


@schema.parametrize()
def test_the_api_conforms_to_its_document(case: Any, system: LocalSystem, world: World) -> None:
    headers = {} if case.path == OPENAPI_PATH else aim(case, world)
    case.call_and_validate(base_url=system.base_url, headers=headers, checks=CHECKS)


async def test_head_of_a_download_leaves_the_connection_usable(system: LocalSystem, world: World) -> None:
    """HEAD answers with the GET's headers only, so the next answer on the same connection is intact."""
    url = f"/v3/exports/{world.targets['operation_id'][0]}/result"
    headers = world.headers["member"]
    connector = aiohttp.TCPConnector(limit=1)  # one connection: the GET follows the HEAD on it
    async with aiohttp.ClientSession(base_url=system.base_url, connector=connector) as api:
        async with api.head(url, headers=headers) as head:
            assert head.status == 200
        async with api.get(url, headers=headers) as get:
            assert get.status == 200
            content = await get.read()
    assert int(head.headers["Content-Length"]) == len(content) > 0
    assert head.headers["ETag"] == get.headers["ETag"]
