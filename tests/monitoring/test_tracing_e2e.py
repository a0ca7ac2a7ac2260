"""Traces on the real processes (docs/monitoring.md: Monitoring, Traces): every part exports to an OTLP receiver in the
test, and one export is one trace from the client's request to the completion callback. A scheduled run's
trace starts at its fire, linked to the schedule's creation. Nothing secret reaches a span or a log line.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from yarl import URL

from devtools.localsystem import LocalSystem
from shared import tracing
from tests.support import cloned_database, unique, wait_for
from tests.support.api_calls import import_lines, make_conversation, wait_terminal
from tests.support.e2e import headers_for, local_system
from tests.support.otlp import ReceivedSpan, otlp_receiver
from tests.support.otlp import Receiver as SpanReceiver
from tests.support.webhook_peers import Receiver, garbling, listening

pytestmark = pytest.mark.e2e

BODY_SECRET = "body-" + secrets.token_hex(8)
QUERY_SECRET = "query-" + secrets.token_hex(8)
TRACESTATE_SECRET = "state" + secrets.token_hex(8)
BAGGAGE_SECRET = "baggage" + secrets.token_hex(8)


class Traced:
    """The system, its log folder, the receiver its parts export to, and the callbacks it sent."""

    def __init__(self, system: LocalSystem, logs: Path, receiver: SpanReceiver, hooks: Receiver, hook_url: str) -> None:
        self.system, self.logs, self.receiver, self.hooks, self.hook_url = system, logs, receiver, hooks, hook_url
        self.tokens: set[str] = set()
        self.signatures: set[str] = set()

    def auth(self, user: str, *, admin: bool = False) -> dict[str, str]:
        """Headers with a token for ``user``, remembered for the search for secrets."""
        headers = headers_for(self.system)(user, admin=admin)
        self.tokens.add(headers["Authorization"].removeprefix("Bearer "))
        return headers

    def log_lines(self) -> list[dict[str, Any]]:
        """Every JSON line every part has logged so far."""
        lines = []
        for path in sorted(self.logs.glob("*.log")):
            for text in path.read_text(encoding="utf-8").splitlines():
                if text.startswith("{"):
                    lines.append(json.loads(text))
        return lines


@pytest.fixture(scope="module")
async def traced(template_db: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Traced]:
    """The compose file's parts with tracing on at the default sampler, exporting every 0.2 s, callbacks
    allowed to this machine; and a receiver for those callbacks.
    """
    logs, hooks = tmp_path_factory.mktemp("e2e-tracing-logs"), Receiver(status=204)
    async with (
        otlp_receiver() as receiver,
        listening(hooks) as hook_port,
        cloned_database(template_db, "chatexport_traced") as database,
    ):
        overrides = {
            "CHATEXPORT_ENVIRONMENT": "development",
            "CHATEXPORT_WEBHOOK_ALLOW_PRIVATE": "true",
            "CHATEXPORT_LOG_LEVEL": "debug",
            "CHATEXPORT_DOWNLOAD_REDIRECT_SECONDS": "60",
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            # Whatever an operator asks to capture, credentials stay out.
            "OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST": ".*",
            "OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_RESPONSE": ".*",
        }
        async with local_system(database, logs, **overrides) as system:
            yield Traced(system, logs, receiver, hooks, f"http://127.0.0.1:{hook_port}/hook?token={QUERY_SECRET}")


def _parent(spans: list[ReceivedSpan], child: ReceivedSpan) -> ReceivedSpan:
    parents = [span for span in spans if span.span_id == child.parent_span_id]
    assert len(parents) == 1, (child, spans)
    return parents[0]


def _one(spans: list[ReceivedSpan], name: str, service: str) -> ReceivedSpan:
    found = [span for span in spans if span.name == name and span.service == service]
    assert len(found) == 1, (name, service, sorted((span.service, span.name) for span in spans))
    return found[0]


def _descends(spans: list[ReceivedSpan], span: ReceivedSpan, ancestor: ReceivedSpan) -> bool:
    by_id = {each.span_id: each for each in spans}
    current: ReceivedSpan | None = span
    while current is not None:
        if current.span_id == ancestor.span_id:
            return True
        current = by_id.get(current.parent_span_id)
    return False


async def test_one_trace_from_the_submit_to_the_callback(traced: Traced) -> None:
    user, cid = unique("trace-user"), unique("trace-conversation")
    client_trace, client_span = secrets.token_hex(16), secrets.token_hex(8)
    async with aiohttp.ClientSession(base_url=traced.system.base_url) as api:
        await make_conversation(api, traced.auth, cid, [user])
        await import_lines(api, traced.auth, cid, [{"message_id": "m1", "sender_id": user, "body": BODY_SECRET}])
        body = {"format": "jsonl", "notify": {"url": traced.hook_url}}
        # Not sampled by the client: the default sampler decides, not the client's flag.
        response = await api.post(
            f"/v3/conversations/{cid}/exports",
            json=body,
            headers={
                **traced.auth(user),
                "Idempotency-Key": unique("key"),
                "traceparent": f"00-{client_trace}-{client_span}-00",
                "tracestate": f"vendor={TRACESTATE_SECRET}",
                "baggage": f"user={BAGGAGE_SECRET}",
            },
        )
        assert response.status == 202, await response.text()
        operation = await wait_terminal(api, traced.auth, user, response.headers["Location"], timeout=60)
        assert operation["state"] == "SUCCEEDED"
        operation_id = operation["operation_id"]
        # A download by redirect: the presigned URL's signature must stay out of spans and logs.
        redirect = await api.get(
            operation["result"]["url"],
            params={"delivery": "redirect"},
            headers=traced.auth(user),
            allow_redirects=False,
        )
        assert redirect.status == 303, await redirect.text()
        traced.signatures.add(URL(redirect.headers["Location"]).query["X-Amz-Signature"])
        # A cancel after the end: its own trace, its span linked to the export's.
        cancel = await api.post(f"/v3/operations/{operation_id}/cancel", headers=traced.auth(user))
        assert cancel.status == 409
    await wait_for(lambda: traced.hooks.received, timeout=30)
    receiver = traced.receiver

    def complete() -> list[ReceivedSpan] | None:
        spans = receiver.trace(client_trace)
        names = {span.name for span in spans}
        # The last span each part ends in this trace (each part sends its spans in order, on its own schedule).
        done = {"export", "callback POST"} <= names and receiver.named("cancel operation")
        return spans if done else None

    spans = await wait_for(complete, timeout=30)

    submit_span = next(span for span in spans if span.kind == "SERVER" and span.service == "chatexport-api")
    assert submit_span.parent_span_id == client_span
    assert submit_span.attributes[tracing.OPERATION_ID] == operation_id
    publish = _one(spans, "outbox publish", "chatexport-relay")
    assert _parent(spans, publish) == submit_span
    send = _parent(spans, next(span for span in spans if span.kind == "PRODUCER"))
    assert send == publish
    producer = next(span for span in spans if span.kind == "PRODUCER")
    receive = next(span for span in spans if span.kind == "CONSUMER" and span.service == "chatexport-worker")
    assert _parent(spans, receive) == producer
    export = _one(spans, "export", "chatexport-worker")
    assert _parent(spans, export) == receive
    assert export.attributes[tracing.OPERATION_ID] == operation_id
    assert export.attributes[tracing.GENERATION] >= 1 and export.attributes[tracing.ATTEMPT] >= 1
    storage = [span for span in spans if span.service == "chatexport-worker" and span.name.startswith("S3.")]
    assert storage and all(_descends(spans, span, export) for span in storage)
    assert any(span.name == "S3.PutObject" or span.name == "S3.CompleteMultipartUpload" for span in storage)
    result = _one(spans, "publish result", "chatexport-worker")
    assert _descends(spans, result, export)
    assert any(
        span.service == "chatexport-worker" and span.kind == "CLIENT" and _descends(spans, span, result)
        for span in spans
        if not span.name.startswith("S3.")
    )
    callback = _one(spans, "callback POST", "chatexport-relay")
    assert _parent(spans, callback) == submit_span
    assert callback.attributes[tracing.OPERATION_ID] == operation_id
    sent = traced.hooks.received[0][0]["traceparent"].split("-")
    assert (sent[1], sent[2]) == (client_trace, callback.span_id)
    # The client's tracestate and baggage went no further than the api's edge.
    assert all(span.trace_state == "" for span in spans)
    assert "tracestate" not in traced.hooks.received[0][0] and "baggage" not in traced.hooks.received[0][0]

    cancel_span = _one(receiver.named("cancel operation"), "cancel operation", "chatexport-api")
    assert cancel_span.trace_id != client_trace
    assert (client_trace, submit_span.span_id) in cancel_span.links

    # Log lines written inside the trace's spans name them.
    lines = [line for line in traced.log_lines() if line.get("trace_id") == client_trace]
    messages = {line["msg"] for line in lines}
    assert {"export submitted", "export succeeded"} <= messages, messages
    span_ids = {span.span_id for span in spans}
    assert all(line["span_id"] in span_ids for line in lines if line["msg"] in ("export submitted", "export succeeded"))


async def test_a_failed_callback_span_holds_the_error_type_not_the_url(traced: Traced) -> None:
    # aiohttp's error for a malformed answer quotes the request's URL, query included.
    user, cid = unique("trace-user"), unique("trace-conversation")
    async with garbling() as port, aiohttp.ClientSession(base_url=traced.system.base_url) as api:
        await make_conversation(api, traced.auth, cid, [user])
        body = {"format": "jsonl", "notify": {"url": f"http://127.0.0.1:{port}/hook?token={QUERY_SECRET}"}}
        response = await api.post(
            f"/v3/conversations/{cid}/exports", json=body, headers={**traced.auth(user), "Idempotency-Key": unique("k")}
        )
        assert response.status == 202, await response.text()
        operation_id = (await response.json())["operation_id"]

        def failed_callback() -> ReceivedSpan | None:
            spans = [
                s
                for s in traced.receiver.named("callback POST")
                if s.attributes.get(tracing.OPERATION_ID) == operation_id
            ]
            return spans[0] if spans else None

        span = await wait_for(failed_callback, timeout=60)
    assert span.attributes["error.type"] == "ClientResponseError"
    # The search for secrets (the last test) covers this span's every attribute and event.


async def test_a_malformed_traceparent_starts_a_new_trace(traced: Traced) -> None:
    user, cid = unique("trace-user"), unique("trace-conversation")
    async with aiohttp.ClientSession(base_url=traced.system.base_url) as api:
        await make_conversation(api, traced.auth, cid, [user])
        response = await api.post(
            f"/v3/conversations/{cid}/exports",
            json={"format": "jsonl"},
            headers={**traced.auth(user), "Idempotency-Key": unique("key"), "traceparent": "00-zz-not-a-context-01"},
        )
        assert response.status == 202, await response.text()
        operation_id = (await response.json())["operation_id"]

    def submit_span() -> ReceivedSpan | None:
        found = [
            span
            for span in traced.receiver.spans
            if span.kind == "SERVER" and span.attributes.get(tracing.OPERATION_ID) == operation_id
        ]
        return found[0] if found else None

    span = await wait_for(submit_span, timeout=30)
    assert span.parent_span_id == "" and len(span.trace_id) == 32 and int(span.trace_id, 16) != 0


async def test_a_scheduled_run_starts_its_trace_at_the_fire(traced: Traced) -> None:
    user, cid = unique("trace-user"), unique("trace-conversation")
    async with aiohttp.ClientSession(base_url=traced.system.base_url) as api:
        await make_conversation(api, traced.auth, cid, [user])
        response = await api.post(
            f"/v3/conversations/{cid}/export-schedules",
            json={"every": "PT1H", "format": "jsonl"},
            headers={**traced.auth(user), "Idempotency-Key": unique("key")},
        )
        assert response.status == 201, await response.text()
        schedule_id = (await response.json())["schedule_id"]
    receiver = traced.receiver

    def traces() -> tuple[ReceivedSpan, ReceivedSpan, ReceivedSpan] | None:
        created = [
            s for s in receiver.spans if s.kind == "SERVER" and s.attributes.get(tracing.SCHEDULE_ID) == schedule_id
        ]
        fired = [s for s in receiver.named("schedule fire") if s.attributes.get(tracing.SCHEDULE_ID) == schedule_id]
        run_trace = receiver.trace(fired[0].trace_id) if fired else []
        exports = [s for s in run_trace if s.name == "export"]
        # Each part sends its spans on its own schedule: wait for the relay's too.
        published = [s for s in run_trace if s.name == "outbox publish"]
        return (created[0], fired[0], exports[0]) if created and exports and published else None

    created, fired, export = await wait_for(traces, timeout=60)
    assert fired.parent_span_id == "" and fired.trace_id != created.trace_id
    assert (created.trace_id, created.span_id) in fired.links
    # The run's wake-up was published under the fire, and its export continued from there.
    run_trace = receiver.trace(fired.trace_id)
    publish = _one(run_trace, "outbox publish", "chatexport-relay")
    assert _parent(run_trace, publish) == fired and _descends(run_trace, export, publish)


async def test_no_span_and_no_log_line_holds_a_secret(traced: Traced) -> None:
    # Runs after the others in this module: their exports, callbacks and schedules are what is searched.
    assert traced.hooks.received and traced.tokens and traced.signatures and traced.receiver.spans
    forbidden = [
        BODY_SECRET,
        QUERY_SECRET,
        TRACESTATE_SECRET,
        BAGGAGE_SECRET,
        "Bearer ",
        *traced.tokens,
        *traced.signatures,
    ]
    exported = b"".join(traced.receiver.raw)
    logged = "\n".join(path.read_text(encoding="utf-8") for path in traced.logs.glob("*.log"))
    assert BODY_SECRET not in logged and exported
    for secret in forbidden:
        assert secret.encode() not in exported, secret
        assert secret not in logged, secret
    captured = [
        (span.name, key, value)
        for span in traced.receiver.spans
        for key, value in span.attributes.items()
        if key.startswith("http.request.header.") or key.startswith("http.response.header.")
    ]
    authorization = [value for _, key, value in captured if key.endswith(".authorization")]
    assert authorization and all(value == ["[REDACTED]"] for value in authorization), authorization


async def test_a_client_cannot_force_sampling(traced: Traced) -> None:
    # A second api that samples no trace; its stop flushes whatever it would export, so once it has
    # exited, every span it was going to send has arrived.
    system = traced.system
    system.start_part("api", name="api-unsampled", extra_env={"OTEL_TRACES_SAMPLER_ARG": "0"})
    system.wait_ready(["api-unsampled"])
    forced_trace, user = secrets.token_hex(16), unique("trace-user")
    async with aiohttp.ClientSession(base_url=system.api_url("api-unsampled")) as api:
        response = await api.get(
            "/v3/operations",
            headers={**traced.auth(user), "traceparent": f"00-{forced_trace}-{secrets.token_hex(8)}-01"},
        )
        assert response.status == 200, await response.text()
    assert system.group.stop("api-unsampled") in (0, -15)
    assert traced.receiver.trace(forced_trace) == []
