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
from aiohttp import web

from chatexport.client.api import Api
from chatexport.client.download import StorageUnavailable, _fetch_from_storage, download_result, part_path
from devtools.broker import delete_broker_objects
from devtools.moto import MotoServer
from shared.settings import Settings
from tests.support import make_settings, wait_for
from tests.support.api_calls import expect_problem, import_lines, make_conversation, read_all, submit, wait_terminal
from tests.support.exports import Auth, Client, download_events
from tests.support.storage_proxy import StorageProxy

pytestmark = pytest.mark.module_database

REDIRECT = {"delivery": "redirect"}


class CuttingProxy(StorageProxy):
    """The recording proxy, which cuts the connection of its next ``cuts`` successful GETs after half of the
    body, as a storage connection that drops in the middle of a download.
    """

    cuts = 0

    async def _respond(
        self, request: web.Request, status: int, body: bytes, headers: dict[str, str]
    ) -> web.StreamResponse:
        if request.method != "GET" or status not in (200, 206) or self.cuts == 0:
            return await super()._respond(request, status, body, headers)
        self.cuts -= 1
        response = web.StreamResponse(status=status, headers=headers)
        response.content_length = len(body)
        await response.prepare(request)
        await response.write(body[: len(body) // 2])
        assert request.transport is not None
        request.transport.abort()
        return response


@pytest.fixture
async def storage_proxy(moto: MotoServer) -> AsyncIterator[CuttingProxy]:
    proxy = CuttingProxy(moto.endpoint_url)
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


def storage_gets(proxy: StorageProxy) -> list[Any]:
    return [request for request in proxy.requests if request.method == "GET"]


async def test_a_cut_storage_connection_is_resumed_in_the_same_run_with_a_fresh_url(
    api: Client, auth: Auth, pool: asyncpg.Pool, storage_proxy: CuttingProxy, tmp_path: Path, pipeline: None
) -> None:
    """docs/command-line.md: Command-line client. Two cuts, three tries: each resume asks the API for a fresh
    URL and continues the part file with a Range guarded by the ETag the storage gave.
    """
    operation = await succeeded_export(api, auth, "c-r", {"format": "jsonl"})
    token = auth("alice")["Authorization"].removeprefix("Bearer ")
    output = tmp_path / "c-r.jsonl"
    storage_proxy.cuts = 2
    async with Api(str(api.make_url("")), token, redirect_above_bytes=0) as client:
        (whole,) = await download_result(client, operation, output)
    assert output.stat().st_size == whole.size_bytes and not part_path(output).exists()
    first, *resumes = storage_gets(storage_proxy)
    assert len(resumes) == 2 and "Range" not in first.headers
    ranges = [int(resume.headers["Range"].removeprefix("bytes=").removesuffix("-")) for resume in resumes]
    assert 0 < ranges[0] < ranges[1] < whole.size_bytes
    assert len({resume.headers["If-Match"] for resume in resumes}) == 1
    assert [outcome for _, outcome in await download_events(pool, operation["operation_id"])] == ["REDIRECTED"] * 3


async def test_a_storage_that_keeps_failing_ends_the_run_naming_the_storage(
    api: Client, auth: Auth, storage_proxy: CuttingProxy, tmp_path: Path, pipeline: None
) -> None:
    operation = await succeeded_export(api, auth, "c-r", {"format": "jsonl"})
    token = auth("alice")["Authorization"].removeprefix("Bearer ")
    output = tmp_path / "c-r.jsonl"
    storage_proxy.cuts = 100
    async with Api(str(api.make_url("")), token, redirect_above_bytes=0, storage_retries=1) as client:
        with pytest.raises(StorageUnavailable, match=r"the storage at 127\.0\.0\.1 failed 2 times"):
            await download_result(client, operation, output)
    assert len(storage_gets(storage_proxy)) == 2
    assert 0 < part_path(output).stat().st_size < operation["result"]["size_bytes"]  # kept for the next run


async def test_the_storage_gets_no_credentials_from_netrc_or_the_proxy_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``~/.netrc`` entry for the storage's host and a proxy URL with a password in the environment: the
    request to the storage goes through the proxy but carries neither credential.
    """
    seen: list[web.Request] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(request)
        return web.Response(body=b"the file", headers={"ETag": '"e"'})

    app = web.Application()
    app.router.add_get("/{tail:.*}", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        netrc = tmp_path / "netrc"
        netrc.write_text("machine storage.example login someone password netrc-secret\n", encoding="ascii")
        netrc.chmod(0o600)
        monkeypatch.setenv("NETRC", str(netrc))
        monkeypatch.setenv("HTTP_PROXY", f"http://someone:proxy-secret@127.0.0.1:{port}")
        for name in ("NO_PROXY", "no_proxy", "http_proxy"):
            monkeypatch.delenv(name, raising=False)
        part = tmp_path / "file.part"
        async with Api("http://api.example", "token", redirect_above_bytes=0) as client:
            status = await _fetch_from_storage(
                client, "http://storage.example/bucket/key?X-Amz-Signature=s", part, 0, last_try=True
            )
    finally:
        await runner.cleanup()
    assert status == 200 and part.read_bytes() == b"the file"
    (request,) = seen  # through the proxy, which answers in the storage's place
    assert "Authorization" not in request.headers and "Proxy-Authorization" not in request.headers
