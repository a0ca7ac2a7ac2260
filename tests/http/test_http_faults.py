"""HTTP-level faults against the server ``main()`` runs (``services.api.app.listening``, its runner and site)
on a free port: requests that break HTTP itself, request bodies with a content coding, and request bodies
that stall (docs/api.md: API reference). Raw sockets where the fault is below what an HTTP client can send.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp import web
from multidict import CIMultiDict
from prometheus_client import REGISTRY

from services.api.app import listening, serve
from shared.settings import Settings
from tests.support import wait_for
from tests.support.api_calls import Headers, check_problem, expect_problem
from tests.support.rows import insert_operation
from tests.support.sockets import handed_socket

pytestmark = pytest.mark.module_database

# Short enough that a stalled body is answered quickly, long enough for a loaded machine to send one.
BODY_TIMEOUT_SECONDS = 0.5
# Short enough that a trickled head is cut off quickly, long enough for a loaded machine to send a whole one.
HEAD_TIMEOUT_SECONDS = 1.0
# aiohttp would keep reading an unfinished body this long before closing; a 408 must not wait for it.
LINGERING_SECONDS = 10.0
SECRET = b"Bearer SECRET-do-not-echo-7f3a9c"
CID = "c-f"
JSON = "application/json"
NDJSON = "application/x-ndjson"


@dataclass(frozen=True)
class Served:
    """The API on ``port``, its runner, and a client session on it."""

    port: int
    runner: web.AppRunner
    api: aiohttp.ClientSession


@pytest.fixture
async def served(settings: Settings) -> AsyncIterator[Served]:
    """The API served as ``main()`` serves it, on a free port, with a short body deadline."""
    served_settings = settings.model_copy(
        update={
            "api_port": 0,
            "request_body_timeout_seconds": BODY_TIMEOUT_SECONDS,
            "request_header_timeout_seconds": HEAD_TIMEOUT_SECONDS,
        }
    )
    async with listening(served_settings) as runner:
        port = runner.addresses[0][1]
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as api:
            yield Served(port, runner, api)


@dataclass(frozen=True)
class Answer:
    """One HTTP response read off a socket up to the server's close."""

    status_line: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    raw: bytes

    @property
    def status(self) -> int:
        return int(self.status_line.split()[1])

    def expect_problem(self, status: int, code: str) -> dict[str, Any]:
        """``tests.support.api_calls.expect_problem`` for an answer read off a socket; failures show it raw."""
        return check_problem(self.status, self.headers["content-type"], self.body.decode(), status, code, case=self.raw)


def parse_answer(raw: bytes) -> Answer:
    head, _, rest = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Answer(status_line, headers, rest[: int(headers["content-length"])], raw)


async def answer_and_close(writer: asyncio.StreamWriter, reader: asyncio.StreamReader, timeout: float) -> Answer:
    """The response up to the server's close of the connection; fails unless both come within ``timeout`` s."""
    try:
        raw = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
    return parse_answer(raw)


async def exchange(port: int, request: bytes, *, timeout: float = 10.0) -> Answer:
    """Send ``request`` as it is on a new connection; the answer, which must close the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    return await answer_and_close(writer, reader, timeout)


# ---- 6. Requests that break HTTP itself ---------------------------------------------------------------------

HTTP_FAULTS = [
    pytest.param(
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Token: " + SECRET + b"a" * 9 * 1024 + b"\r\n\r\n",
        431,
        "REQUEST_HEADER_TOO_LARGE",
        id="header-over-8-kib",
    ),
    pytest.param(
        b"GET /" + SECRET.replace(b" ", b"-") + b"a" * 9 * 1024 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        431,
        "REQUEST_HEADER_TOO_LARGE",
        id="request-line-over-8-kib",
    ),
    pytest.param(b"GARBAGE " + SECRET + b" HTTP/1.1\r\nHost: x\r\n\r\n", 400, "MALFORMED_REQUEST", id="garbage-line"),
    pytest.param(b"\x16\x03\x01\x02\x00" + SECRET + b"\r\n\r\n", 400, "MALFORMED_REQUEST", id="tls-on-the-http-port"),
    pytest.param(
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX Bad " + SECRET + b": v\r\n\r\n",
        400,
        "MALFORMED_REQUEST",
        id="invalid-header-name",
    ),
    pytest.param(
        b"POST /v2/conversations/c-f/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n"
        b"X-Token: " + SECRET + b"\r\n\r\n{}",
        400,
        "MALFORMED_REQUEST",
        id="two-content-lengths",
    ),
    pytest.param(
        b"POST /v2/conversations/c-f/messages HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"zz" + SECRET + b"\r\n{}\r\n0\r\n\r\n",
        400,
        "MALFORMED_REQUEST",
        id="bad-chunk-size",
    ),
]


@pytest.mark.parametrize(("request_bytes", "status", "code"), HTTP_FAULTS)
async def test_a_request_that_breaks_http_is_a_problem_that_quotes_nothing(
    served: Served, caplog: pytest.LogCaptureFixture, request_bytes: bytes, status: int, code: str
) -> None:
    with caplog.at_level(logging.DEBUG):
        answer = await exchange(served.port, request_bytes)
    assert answer.status_line.startswith(("HTTP/1.0 ", "HTTP/1.1 ")), answer.raw
    assert answer.status == status, answer.raw
    answer.expect_problem(status, code)
    assert b"SECRET" not in answer.raw
    # The log line names the parser error's class, and nothing of the request.
    refused = [record for record in caplog.records if record.getMessage() == "request refused by the HTTP parser"]
    assert [(record.levelno, getattr(record, "code", None)) for record in refused] == [(logging.INFO, code)]
    assert "SECRET" not in caplog.text
    assert all("SECRET" not in repr(vars(record)) for record in caplog.records)


async def converse(port: int, request: bytes, *endings: bytes) -> list[bytes]:
    """Send ``request`` on a new connection and read the answers up to each of ``endings`` in turn."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return [await asyncio.wait_for(reader.readuntil(ending), 10) for ending in endings]
    finally:
        writer.close()


async def test_the_connection_still_serves_after_an_ordinary_problem(served: Served) -> None:
    """Only requests that break HTTP close the connection: a 404 keeps it for the next request."""
    first, second = await converse(
        served.port,
        b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
        b'"NOT_FOUND"}',
        b'{"status": "ok"}',
    )
    assert first.startswith(b"HTTP/1.1 404 ") and second.startswith(b"HTTP/1.1 200 ")


@pytest.mark.parametrize(
    ("path", "expect"),
    [
        ("/v2/conversations/c-f/messages", b"x-" + SECRET),
        ("/v2/conversations/c-f/messages", b"100-continue, x-" + SECRET),
        ("/nowhere", b"x-" + SECRET),
        # The lines of a list field are one list, whichever comes first.
        ("/v2/conversations/c-f/messages", b"100-continue\r\nExpect: x-" + SECRET),
        ("/healthz", b"100-continue\r\nExpect: x-" + SECRET),
    ],
)
async def test_an_unmet_expectation_is_a_problem_that_quotes_nothing(
    served: Served, caplog: pytest.LogCaptureFixture, path: str, expect: bytes
) -> None:
    request = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: ".encode() + expect + b"\r\n\r\n{}"
    with caplog.at_level(logging.DEBUG):
        answer = await exchange(served.port, request)
    answer.expect_problem(417, "EXPECTATION_FAILED")
    assert b"SECRET" not in answer.raw
    assert "SECRET" not in caplog.text


@pytest.mark.parametrize(
    "expect",
    [b"100-continue", b"100-Continue", b",100-continue", b"100-continue, 100-continue", b"100-continue\r\nExpect: "],
)
async def test_100_continue_is_met_in_any_list_spelling(served: Served, expect: bytes) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nExpect: " + expect + b"\r\n\r\n"
    [answer] = await converse(served.port, request, b'{"status": "ok"}')
    assert answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 "), answer


async def test_an_expect_of_empty_elements_only_expects_nothing(served: Served) -> None:
    [answer] = await converse(
        served.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nExpect: ,\r\n\r\n", b'{"status": "ok"}'
    )
    assert answer.startswith(b"HTTP/1.1 200 "), answer


# ---- 7. and 8. Routes that read a body ----------------------------------------------------------------------


@dataclass(frozen=True)
class BodyRoute:
    """A route that reads a request body: a body it accepts and the status it then answers."""

    method: str
    path: str
    content_type: str
    body: bytes
    accepted: int
    admin: bool = False
    headers: dict[str, str] = field(default_factory=dict)


BODY_ROUTES = {
    "send": BodyRoute("POST", f"/v2/conversations/{CID}/messages", JSON, b'{"message_id": "m-new", "body": "hi"}', 200),
    "submit": BodyRoute(
        "POST", f"/v3/conversations/{CID}/exports", JSON, b'{"format": "jsonl"}', 202, headers={"Idempotency-Key": "k"}
    ),
    "cancel": BodyRoute("POST", "/v3/operations/op_queued/cancel", JSON, b"{}", 202),
    "admin-put": BodyRoute("PUT", f"/admin/conversations/{CID}", JSON, b'{"members": ["alice", "carol"]}', 204, True),
    "import": BodyRoute(
        "POST",
        f"/admin/conversations/{CID}/messages:import",
        NDJSON,
        b'{"message_id": "m-imp", "sender_id": "alice", "body": "x"}\n',
        200,
        True,
    ),
    "requeue": BodyRoute("POST", "/admin/operations/op_parked/requeue", JSON, b"{}", 202, True),
}


async def arrange(served: Served, auth: Headers, pool: asyncpg.Pool) -> None:
    """Conversation ``c-f`` of alice and bob with one message, alice's QUEUED ``op_queued`` and her parked
    ``op_parked``: each route of ``BODY_ROUTES`` would change something if its body were taken.
    """
    admin = auth("root", admin=True)
    response = await served.api.put(f"/admin/conversations/{CID}", json={"members": ["alice", "bob"]}, headers=admin)
    assert response.status == 204
    response = await served.api.post(
        f"/v2/conversations/{CID}/messages", json={"message_id": "m1", "body": "a"}, headers=auth("alice")
    )
    assert response.status == 200
    await insert_operation(pool, "op_queued", "QUEUED", conversation_id=CID)
    await insert_operation(
        pool,
        "op_parked",
        "FAILED_REPAIR",
        conversation_id=CID,
        attempt=5,
        generation=5,
        error_code="STORAGE_UNAVAILABLE",
    )


async def stored(pool: asyncpg.Pool) -> dict[str, Any]:
    """What the body-reading routes write."""
    async with pool.acquire() as conn:
        return {
            "messages": await conn.fetch("SELECT conversation_id, message_id FROM messages ORDER BY 1, 2"),
            "members": await conn.fetch("SELECT conversation_id, user_id FROM conversation_members ORDER BY 1, 2"),
            "operations": await conn.fetch("SELECT operation_id, state, generation FROM operations ORDER BY 1"),
            "keys": await conn.fetchval("SELECT count(*) FROM idempotency_keys"),
            "outbox": await conn.fetchval("SELECT count(*) FROM outbox"),
        }


def route_headers(route: BodyRoute, auth: Headers) -> dict[str, str]:
    return {
        **auth("root" if route.admin else "alice", admin=route.admin),
        "Content-Type": route.content_type,
        **route.headers,
    }


def not_gzip(body: bytes) -> bytes:
    return b"this is not compressed data " + body


# (Content-Encoding field values, how the body is encoded): every coding but identity is refused, whatever
# the body holds and however the name is spelt.
REFUSED_CODINGS: list[tuple[list[str], Callable[[bytes], bytes]]] = [
    (["gzip"], gzip.compress),
    (["gzip"], not_gzip),
    (["x-gzip"], gzip.compress),
    (["deflate"], zlib.compress),
    (["deflate"], not_gzip),
    (["br"], not_gzip),
    (["zstd"], not_gzip),
    (["compress"], not_gzip),
    (["x-custom"], bytes),
    (["gzip, identity"], gzip.compress),
    (["identity, gzip"], gzip.compress),
    (["identity", "gzip"], gzip.compress),
    (["GZIP"], gzip.compress),
    (["Deflate"], zlib.compress),
    ([" gzip "], gzip.compress),
]


@pytest.mark.parametrize("name", list(BODY_ROUTES))
async def test_a_body_with_a_content_coding_is_415_and_nothing_is_stored(
    served: Served, auth: Headers, pool: asyncpg.Pool, name: str
) -> None:
    route = BODY_ROUTES[name]
    await arrange(served, auth, pool)
    before = await stored(pool)
    for codings, encode in REFUSED_CODINGS:
        headers = CIMultiDict(route_headers(route, auth))
        for coding in codings:
            headers.add("Content-Encoding", coding)
        response = await served.api.request(route.method, route.path, data=encode(route.body), headers=headers)
        await expect_problem(response, 415, "UNSUPPORTED_CONTENT_ENCODING", case=codings)
        assert response.headers.getall("Accept-Encoding") == ["identity"], codings
    assert await stored(pool) == before
    # The same request without a coding, or with identity however spelt, is taken.
    headers = CIMultiDict(route_headers(route, auth))
    headers.add("Content-Encoding", "Identity")
    headers.add("Content-Encoding", "")
    response = await served.api.request(route.method, route.path, data=route.body, headers=headers)
    assert response.status == route.accepted, await response.text()
    assert await stored(pool) != before


@pytest.mark.parametrize("name", ["send", "import"])
async def test_an_unauthenticated_coded_body_is_401_first(served: Served, auth: Headers, name: str) -> None:
    route = BODY_ROUTES[name]
    headers = {"Content-Type": route.content_type, "Content-Encoding": "gzip"}
    response = await served.api.request(route.method, route.path, data=not_gzip(route.body), headers=headers)
    await expect_problem(response, 401, "UNAUTHENTICATED")


def stalled_request(route: BodyRoute, auth: Headers, form: str) -> bytes:
    """``route``'s request with a body that stops before its end: ``short-length`` promises 100 bytes more
    than it sends; ``unterminated-chunks`` sends one chunk and never the last (zero-size) one.
    """
    head = f"{route.method} {route.path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in route_headers(route, auth).items())
    if form == "short-length":
        return f"{head}Content-Length: {len(route.body) + 100}\r\n\r\n".encode() + route.body
    return f"{head}Transfer-Encoding: chunked\r\n\r\n{len(route.body):x}\r\n".encode() + route.body + b"\r\n"


@pytest.mark.parametrize("form", ["short-length", "unterminated-chunks"])
@pytest.mark.parametrize("name", list(BODY_ROUTES))
async def test_a_stalled_body_is_408_and_the_connection_closes(
    served: Served, auth: Headers, pool: asyncpg.Pool, name: str, form: str
) -> None:
    route = BODY_ROUTES[name]
    await arrange(served, auth, pool)
    before = await stored(pool)
    loop = asyncio.get_running_loop()
    started = loop.time()
    # The answer and the close must both come well before aiohttp's lingering would have ended.
    answer = await exchange(served.port, stalled_request(route, auth, form), timeout=LINGERING_SECONDS - 2)
    assert loop.time() - started >= BODY_TIMEOUT_SECONDS - 0.05
    assert answer.status_line.startswith("HTTP/1.1 408 "), answer.raw
    answer.expect_problem(408, "REQUEST_TIMEOUT")
    assert answer.headers["connection"] == "close"
    assert await stored(pool) == before


async def test_a_trickled_request_head_is_cut_off_at_its_deadline(served: Served) -> None:
    before = head_timeouts()
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    started = loop.time()
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    closed = False
    try:
        # One more header line every tenth of the deadline: each arrives, none completes the head.
        for number in range(100):
            writer.write(f"X-Slow-{number}: y\r\n".encode())
            await writer.drain()
            try:
                closed = await asyncio.wait_for(reader.read(), HEAD_TIMEOUT_SECONDS / 10) == b""
            except TimeoutError:
                continue
            break
    except ConnectionError:
        closed = True
    finally:
        writer.close()
    elapsed = loop.time() - started
    assert closed, "the connection outlived ten head deadlines"
    assert HEAD_TIMEOUT_SECONDS - 0.05 <= elapsed < HEAD_TIMEOUT_SECONDS + 2, elapsed
    await wait_for(lambda: head_timeouts() == before + 1, timeout=5)


async def test_an_idle_connection_between_requests_outlives_the_head_deadline(served: Served) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    try:
        for _ in range(2):
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200 "), head
            length = int(parse_answer(head + b"").headers["content-length"])
            await asyncio.wait_for(reader.readexactly(length), 5)
            # Nothing arrives and the connection stays open past the head deadline: keep-alive rules here.
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(reader.read(1), HEAD_TIMEOUT_SECONDS * 2)
    finally:
        writer.close()


def head_timeouts() -> float:
    value = REGISTRY.get_sample_value("chatexport_api_request_head_timeouts_total")
    return value or 0.0


async def test_a_bad_chunk_after_the_body_began_is_408_at_the_deadline(
    served: Served, auth: Headers, pool: asyncpg.Pool
) -> None:
    """aiohttp's parser stops delivering a body whose chunk framing breaks once the route reads it; the
    deadline answers it. (Sent with the headers, the same bad chunk is a 400, as in the cases above.)
    """
    route = BODY_ROUTES["send"]
    await arrange(served, auth, pool)
    before = await stored(pool)
    head = stalled_request(route, auth, "unterminated-chunks").partition(b"\r\n\r\n")[0]
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    # The 100 Continue says the route has begun: what follows is parsed apart from the headers.
    writer.write(head + b"\r\nExpect: 100-continue\r\n\r\n")
    assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10) == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"zz" + SECRET + b"\r\n{}\r\n0\r\n\r\n")
    answer = await answer_and_close(writer, reader, LINGERING_SECONDS - 2)
    assert answer.status == 408, answer.raw
    answer.expect_problem(408, "REQUEST_TIMEOUT")
    assert b"SECRET" not in answer.raw
    assert await stored(pool) == before


# ---- The server main() runs drains on a stop ----------------------------------------------------------------


WAITING_FOR_A_LOCK = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
)


async def refuses_connections(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except (ConnectionRefusedError, ConnectionResetError):  # reset: caught in the listener's close
        return True
    writer.close()
    return False


async def test_a_request_in_flight_when_the_server_stops_is_answered(
    settings: Settings, auth: Headers, pool: asyncpg.Pool
) -> None:
    fd, port = handed_socket()  # the API owns the socket: once it stops, the port refuses connections
    stop = asyncio.Event()
    serving = asyncio.create_task(serve(settings.model_copy(update={"api_socket_fd": fd}), stop=stop))

    async def accepting() -> bool:
        if serving.done():
            serving.result()  # a failed start-up fails the test with its own error
        return not await refuses_connections(port)

    try:
        await wait_for(accepting)
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as api:
            response = await api.put(
                f"/admin/conversations/{CID}", json={"members": ["alice"]}, headers=auth("r", admin=True)
            )
            assert response.status == 204
            # A send waits for the conversation's row lock, held here: it is in flight, its body read.
            blocker = await asyncpg.connect(settings.database_url)
            try:
                locked = blocker.transaction()
                await locked.start()
                await blocker.execute("SELECT 1 FROM conversations WHERE conversation_id = $1 FOR UPDATE", CID)
                send = asyncio.create_task(
                    api.post(
                        f"/v2/conversations/{CID}/messages",
                        json={"message_id": "m1", "body": "a"},
                        headers=auth("alice"),
                    )
                )
                await wait_for(lambda: pool.fetchval(WAITING_FOR_A_LOCK))
                stop.set()
                await wait_for(lambda: refuses_connections(port))
                assert not serving.done()
                await locked.rollback()
            finally:
                await blocker.close()
            response = await send
            assert response.status == 200, await response.text()
        await asyncio.wait_for(serving, settings.shutdown_grace_seconds + 5)  # it drained and returned
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(serving, return_exceptions=True), settings.shutdown_grace_seconds + 5)
    assert await pool.fetchval("SELECT count(*) FROM messages") == 1
