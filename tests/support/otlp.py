"""A local OTLP/HTTP trace receiver for the tests and the benchmark: it decodes what the parts export
(``POST /v1/traces``, protobuf) into ``ReceivedSpan`` values, as a collector would.
"""

from __future__ import annotations

import contextlib
import gzip
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tests.support.webhook_peers import serving

KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span: ids in lowercase hex (``parent_span_id`` "" for a root), its service's name, its
    kind ("SERVER", "CLIENT", ...), its attributes, the (trace id, span id) of its links, and its W3C
    ``tracestate`` ("" when none).
    """

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: str
    attributes: dict[str, Any]
    links: list[tuple[str, str]]
    trace_state: str


@dataclass
class Receiver:
    """The spans received so far, and the URL to give ``OTEL_EXPORTER_OTLP_ENDPOINT``."""

    endpoint: str
    spans: list[ReceivedSpan] = field(default_factory=list)
    raw: list[bytes] = field(default_factory=list)

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        """The spans of ``trace_id`` received so far."""
        return [span for span in self.spans if span.trace_id == trace_id]

    def named(self, name: str, *, service: str | None = None) -> list[ReceivedSpan]:
        """The spans called ``name`` (of ``service``, when given)."""
        return [span for span in self.spans if span.name == name and service in (None, span.service)]


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    return getattr(value, kind) if kind else None


def decode(body: bytes) -> list[ReceivedSpan]:
    """The spans of one ``ExportTraceServiceRequest``."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = {attribute.key: _value(attribute.value) for attribute in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        service=str(resource.get("service.name")),
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        kind=KINDS.get(span.kind, str(span.kind)),
                        attributes={attribute.key: _value(attribute.value) for attribute in span.attributes},
                        links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                        trace_state=span.trace_state,
                    )
                )
    return spans


@contextlib.asynccontextmanager
async def otlp_receiver() -> AsyncIterator[Receiver]:
    """Listen on a free loopback port for the block; yield the receiver that collects what arrives."""
    receiver = Receiver(endpoint="")

    async def traces(request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        receiver.raw.append(body)
        receiver.spans.extend(decode(body))
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/traces", traces)
    async with serving(app) as port:
        receiver.endpoint = f"http://127.0.0.1:{port}"
        yield receiver
