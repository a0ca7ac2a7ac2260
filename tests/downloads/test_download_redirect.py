"""Downloads by redirect on the real servers (docs/api.md: Downloads, Download by redirect): the same checks
before the 303 as before a streamed file, the presigned URL's parameters, a fresh signature per request, nothing
of the URL in the logs, and the command-line client fetching from the storage without the token, resuming with
the storage's ETag. The presigned URLs name a recording proxy in front of moto, which checks no signature.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import aiohttp
import asyncpg
import pytest

from chatexport.client.api import Api
from chatexport.client.download import download_result, part_path
from devtools.broker import delete_broker_objects
from devtools.moto import MotoServer
from shared.settings import Settings
from tests.support import make_settings, wait_for
from tests.support.api_calls import expect_problem, import_lines, make_conversation, read_all, submit, wait_terminal
from tests.support.exports import Auth, Client, download_events
from tests.support.storage_proxy import StorageProxy

pytestmark = pytest.mark.module_database

REDIRECT = {"delivery": "redirect"}


@pytest.fixture
async def storage_proxy(moto: MotoServer) -> AsyncIterator[StorageProxy]:
    proxy = StorageProxy(moto.endpoint_url)
    await proxy.start()
    yield proxy
    await proxy.close()


@pytest.fixture
async def settings(database_url: str, moto: MotoServer, storage_proxy: StorageProxy) -> AsyncIterator[Settings]:
    """The test's settings, presigning for the recording proxy, with URLs that live 45 seconds."""
    test_settings = make_settings(
        database_url, moto.endpoint_url, s3_public_endpoint_url=storage_proxy.url, download_redirect_seconds=45
    )
    yield test_settings
    await delete_broker_objects(test_settings)


async def succeeded_export(api: Client, auth: Auth, cid: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """``cid`` with alice and bob and 40 messages, exported by alice and finished."""
    await make_conversation(api, auth, cid, ["alice", "bob"])
    await import_lines(
        api, auth, cid, [{"message_id": f"m{n}", "sender_id": "alice", "body": f"<b>{n}</b>"} for n in range(40)]
    )
    response = await submit(api, auth, "alice", cid, body or {"format": "html"}, "k-1")
    assert response.status == 202, await response.text()
    operation = await wait_terminal(api, auth, "alice", response.headers["Location"])
    assert operation["state"] == "SUCCEEDED", operation
    return operation


async def redirected(api: Client, auth: Auth, url: str, **headers: str) -> aiohttp.ClientResponse:
    response = await api.get(url, params=REDIRECT, headers={**auth("alice"), **headers}, allow_redirects=False)
    assert response.status == 303, await response.text()
    return response


async def test_the_redirect_is_a_presigned_url_whose_answer_is_an_attachment(
    api: Client, auth: Auth, settings: Settings, pool: asyncpg.Pool, storage_proxy: StorageProxy, pipeline: None
) -> None:
    operation = await succeeded_export(api, auth, "c-r")
    url = operation["result"]["url"]
    streamed = await api.get(url, headers=auth("alice"))
    content = await streamed.read()

    response = await redirected(api, auth, url)
    assert response.headers["Cache-Control"] == "no-store"
    assert response.headers["Referrer-Policy"] == "no-referrer"
    assert await response.read() == b""
    location = urlsplit(response.headers["Location"])
    assert f"{location.scheme}://{location.netloc}" == storage_proxy.url
    query = dict(parse_qsl(location.query))
    assert query["X-Amz-Expires"] == "45" and query["X-Amz-Algorithm"] == "AWS4-HMAC-SHA256"
    assert query["response-content-disposition"] == streamed.headers["Content-Disposition"]
    assert query["response-content-disposition"].startswith("attachment; ")
    assert query["response-content-type"] == "text/html; charset=utf-8"
    assert query["response-cache-control"] == "no-store"
    signed_at = datetime.datetime.strptime(query["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.UTC)
    assert abs((datetime.datetime.now(datetime.UTC) - signed_at).total_seconds()) < 30

    async with aiohttp.ClientSession() as session, session.get(response.headers["Location"]) as stored:
        assert stored.status == 200
        assert await stored.read() == content
        assert stored.headers["Content-Disposition"] == streamed.headers["Content-Disposition"]
        assert stored.headers["Cache-Control"] == "no-store"
    head = await api.head(url, params=REDIRECT, headers=auth("alice"), allow_redirects=False)
    assert head.status == 303 and "X-Amz-Signature" in head.headers["Location"]
    assert await download_events(pool, operation["operation_id"]) == [
        ("alice", "GRANTED"),
        ("alice", "REDIRECTED"),
        ("alice", "REDIRECTED"),
    ]


async def test_each_redirect_is_signed_when_it_is_asked_for(api: Client, auth: Auth, pipeline: None) -> None:
    url = (await succeeded_export(api, auth, "c-r"))["result"]["url"]
    first = dict(parse_qsl(urlsplit((await redirected(api, auth, url)).headers["Location"]).query))
    later: dict[str, str] = {}

    async def signed_in_a_later_second() -> bool:
        later.update(parse_qsl(urlsplit((await redirected(api, auth, url)).headers["Location"]).query))
        return later["X-Amz-Date"] != first["X-Amz-Date"]

    await wait_for(signed_in_a_later_second, timeout=10)
    assert later["X-Amz-Signature"] != first["X-Amz-Signature"]


async def test_the_redirect_comes_after_every_check_of_a_streamed_download(
    api: Client, auth: Auth, pool: asyncpg.Pool, pipeline: None
) -> None:
    operation = await succeeded_export(api, auth, "c-r")
    operation_id, url = operation["operation_id"], operation["result"]["url"]
    etag = f'"{operation["result"]["sha256"]}"'
    # A non-member, or anyone for an unknown id, gets the same 404 as without the redirect.
    stranger = await api.get(url, params=REDIRECT, headers=auth("mallory"), allow_redirects=False)
    unknown = await api.get(
        "/v3/exports/op_unknown/result", params=REDIRECT, headers=auth("mallory"), allow_redirects=False
    )
    assert await expect_problem(stranger, 404, "NOT_FOUND") == await expect_problem(unknown, 404, "NOT_FOUND")
    current = await api.get(
        url, params=REDIRECT, headers={**auth("alice"), "If-None-Match": etag}, allow_redirects=False
    )
    assert current.status == 304
    beyond = await api.get(
        url, params=REDIRECT, headers={**auth("alice"), "Range": "bytes=999999-"}, allow_redirects=False
    )
    await expect_problem(beyond, 416, "RANGE_NOT_SATISFIABLE")
    bogus = await api.get(url, params={"delivery": "elsewhere"}, headers=auth("alice"), allow_redirects=False)
    await expect_problem(bogus, 422, "VALIDATION_FAILED")
    admin = auth("root", admin=True)
    assert (await api.delete("/admin/conversations/c-r/members/alice", headers=admin)).status == 204
    revoked = await api.get(url, params=REDIRECT, headers=auth("alice"), allow_redirects=False)
    await expect_problem(revoked, 403, "ACCESS_REVOKED")
    await pool.execute(
        "UPDATE operations SET state = 'EXPIRED', result_expires_at = now() WHERE operation_id = $1", operation_id
    )
    expired = await api.get(url, params=REDIRECT, headers=auth("alice"), allow_redirects=False)
    await expect_problem(expired, 410, "RESULT_EXPIRED")
    outcomes = [outcome for _, outcome in await download_events(pool, operation_id)]
    assert "REDIRECTED" not in outcomes and "NOT_MODIFIED" in outcomes


async def test_no_log_line_holds_the_urls_signature(
    api: Client, auth: Auth, caplog: pytest.LogCaptureFixture, pipeline: None
) -> None:
    url = (await succeeded_export(api, auth, "c-r"))["result"]["url"]
    with caplog.at_level(logging.DEBUG):
        location = (await redirected(api, auth, url)).headers["Location"]
        signature = dict(parse_qsl(urlsplit(location).query))["X-Amz-Signature"]
    logged = [f"{record.getMessage()} {record.__dict__}" for record in caplog.records]
    assert logged and not [line for line in logged if signature in line or "X-Amz-Signature" in line]


async def test_the_client_fetches_from_the_storage_without_the_token_and_resumes_with_its_etag(
    api: Client, auth: Auth, pool: asyncpg.Pool, storage_proxy: StorageProxy, tmp_path: Path, pipeline: None
) -> None:
    operation = await succeeded_export(api, auth, "c-r", {"format": "jsonl"})
    token = auth("alice")["Authorization"].removeprefix("Bearer ")
    output = tmp_path / "c-r.jsonl"
    async with Api(str(api.make_url("")), token, redirect_above_bytes=0) as client:
        (whole,) = await download_result(client, operation, output)
    content = output.read_bytes()
    assert len(content) == whole.size_bytes and len(await read_all(api, auth, "alice", "c-r")) == 40
    (fetched,) = [request for request in storage_proxy.requests if request.method == "GET"]
    assert "Authorization" not in fetched.headers and "X-Amz-Signature" in fetched.query

    # A download cut short: the part file holds the first bytes, and the storage's ETag of its start.
    output.unlink()
    part = part_path(output)
    part.write_bytes(content[:100])
    async with aiohttp.ClientSession() as session, session.get(fetched_url(storage_proxy, fetched)) as first:
        storage_etag = first.headers["ETag"]
    part.with_name(part.name + ".etag").write_text(storage_etag, encoding="ascii")
    storage_proxy.requests.clear()
    async with Api(str(api.make_url("")), token, redirect_above_bytes=0) as client:
        await download_result(client, operation, output)
    assert output.read_bytes() == content and not part.exists()
    (resumed,) = [request for request in storage_proxy.requests if request.method == "GET"]
    assert "Authorization" not in resumed.headers
    assert (resumed.headers["Range"], resumed.headers["If-Match"]) == ("bytes=100-", storage_etag)
    # The API was asked for a fresh URL at the resume.
    assert [outcome for _, outcome in await download_events(pool, operation["operation_id"])] == [
        "REDIRECTED",
        "REDIRECTED",
    ]


def fetched_url(proxy: StorageProxy, request: Any) -> str:
    """The URL ``request`` fetched through ``proxy``, query included."""
    return str(aiohttp.client.URL(proxy.url + request.path).with_query(request.query))


async def test_a_part_the_stored_object_no_longer_continues_is_fetched_again_from_the_start(
    api: Client, auth: Auth, storage_proxy: StorageProxy, tmp_path: Path, pipeline: None
) -> None:
    operation = await succeeded_export(api, auth, "c-r", {"format": "jsonl"})
    token = auth("alice")["Authorization"].removeprefix("Bearer ")
    output = tmp_path / "c-r.jsonl"
    part = part_path(output)
    part.write_bytes(b"bytes of another file")
    part.with_name(part.name + ".etag").write_text('"not-the-stored-etag"', encoding="ascii")
    async with Api(str(api.make_url("")), token, redirect_above_bytes=0) as client:
        (whole,) = await download_result(client, operation, output)
    assert output.stat().st_size == whole.size_bytes
    refused, fetched = [request for request in storage_proxy.requests if request.method == "GET"]
    assert refused.headers["If-Match"] == '"not-the-stored-etag"'
    assert "Range" not in fetched.headers and "Authorization" not in fetched.headers
