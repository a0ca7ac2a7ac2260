"""The OpenTelemetry SDK behind ``shared.tracing``, imported only when tracing is on (docs/monitoring.md: Monitoring,
Traces).

``install`` sets the global tracer provider (the OTLP/HTTP exporter, a batch processor, the standard
``OTEL_*`` variables), W3C trace context as the only propagation format, and the maintained
instrumentations of asyncpg, aio-pika and botocore/aiobotocore; the api's also aiohttp's server.
Completion callbacks get spans of our own (``services.relay.webhooks``): the aiohttp client
instrumentation would record the callback URL's query.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.aio_pika import AioPikaInstrumentor
from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor
from opentelemetry.instrumentation.botocore import AiobotocoreInstrumentor
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import Attributes

from shared.tracing.attributes import ROOT_MARKER
from shared.tracing.attributes import Attributes as SpanAttributes

# Whatever the environment asks to capture, these headers' values never reach a span: credentials, and
# a download's Location, whose query is a presigned URL's signature.
ALWAYS_SANITIZED_HEADERS = ("authorization", "proxy-authorization", "cookie", "set-cookie", "location")
SANITIZE_VARIABLE = "OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SANITIZE_FIELDS"
# Probes and scrapes every few seconds would bury the exports' traces.
EXCLUDED_URLS_VARIABLE = "OTEL_PYTHON_AIOHTTP_SERVER_EXCLUDED_URLS"
DEFAULT_EXCLUDED_URLS = "/healthz,/readyz,/metrics"
# How long a stopping part waits for its last spans to be sent (``SdkBackend.shutdown``).
SHUTDOWN_SECONDS = 3.0


class TraceparentOnly(TraceContextTextMapPropagator):
    """W3C trace context, minus ``tracestate``: a client's vendor state is dropped at the edge, and what we
    store and forward is the ``traceparent`` alone. Baggage is not propagated at all.
    """

    def extract(self, carrier: Any, context: Context | None = None, getter: Any = None) -> Context:
        """The context of the carrier's valid ``traceparent``, with an empty ``tracestate``; ``context`` (or
        an empty one) when there is none or it is malformed (a new trace starts, never an error).
        """
        kwargs = {} if getter is None else {"getter": getter}
        extracted = super().extract(carrier, context, **kwargs)
        remote = trace.get_current_span(extracted).get_span_context()
        if not remote.is_valid:
            return extracted
        bare = SpanContext(remote.trace_id, remote.span_id, is_remote=True, trace_flags=remote.trace_flags)
        return trace.set_span_in_context(NonRecordingSpan(bare), context)


class PartSampler(Sampler):
    """The default sampler of a part (docs/monitoring.md: Monitoring, Traces), when ``OTEL_TRACES_SAMPLER`` is unset.

    A span under one of our own spans follows its parent's decision. A trace starts only at an explicit
    root (``shared.tracing.span(root=True)``: a janitor pass, a schedule's fire) or at a request the api
    serves, and is sampled with probability ``ratio`` by a random draw here; a driver's span outside any
    trace (the relay's and janitor's polling queries) is dropped. On the ``edge`` (the api) a client's
    ``traceparent`` is continued but its sampled flag and trace id decide nothing: a client cannot force
    sampling. Elsewhere a remote parent is our own (a stored context, a message's headers) and is followed.
    """

    def __init__(self, ratio: float, *, edge: bool) -> None:
        self._ratio = ratio
        self._edge = edge

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        """The decision for a new span (the SDK's ``Sampler`` interface); the root marker is not kept."""
        kept = {key: value for key, value in (attributes or {}).items() if key != ROOT_MARKER}
        parent = trace.get_current_span(parent_context).get_span_context()
        if parent.is_valid and not (parent.is_remote and self._edge):
            sampled = parent.trace_flags.sampled
        elif parent.is_valid or kind is SpanKind.SERVER or ROOT_MARKER in (attributes or {}):
            sampled = random.random() < self._ratio
        else:
            sampled = False
        return SamplingResult(Decision.RECORD_AND_SAMPLE if sampled else Decision.DROP, kept if sampled else None)

    def get_description(self) -> str:
        """The sampler's name, as the SDK reports it."""
        return f"PartSampler{{{self._ratio},edge={self._edge}}}"


def part_sampler(environ: Mapping[str, str], *, edge: bool) -> Sampler | None:
    """None (the SDK reads ``OTEL_TRACES_SAMPLER`` and its argument) when that variable is set, else a
    ``PartSampler`` at ``OTEL_TRACES_SAMPLER_ARG`` (default 1.0, clamped to [0, 1]).
    """
    if environ.get("OTEL_TRACES_SAMPLER", "").strip():
        return None
    try:
        ratio = float(environ.get("OTEL_TRACES_SAMPLER_ARG", "") or 1.0)
    except ValueError:
        ratio = 1.0
    return PartSampler(min(max(ratio, 0.0), 1.0), edge=edge)


def sanitize_headers(environ: MutableMapping[str, str]) -> None:
    """Add ``ALWAYS_SANITIZED_HEADERS`` to the header capture's sanitized fields in ``environ``."""
    asked = [field.strip() for field in environ.get(SANITIZE_VARIABLE, "").split(",") if field.strip()]
    environ[SANITIZE_VARIABLE] = ",".join([*asked, *ALWAYS_SANITIZED_HEADERS])


def resource(service: str, environ: Mapping[str, str]) -> Resource:
    """The process's resource: ``OTEL_RESOURCE_ATTRIBUTES`` as the SDK reads it, named by
    ``OTEL_SERVICE_NAME``, else by a ``service.name`` among those attributes, else ``chatexport-<service>``.
    """
    name = environ.get("OTEL_SERVICE_NAME", "").strip()
    if not name and "service.name=" in environ.get("OTEL_RESOURCE_ATTRIBUTES", ""):
        return Resource.create({})
    return Resource.create({SERVICE_NAME: name or f"chatexport-{service}"})


class SdkBackend:
    """``shared.tracing.Backend`` on the global tracer provider."""

    def __init__(self, provider: TracerProvider) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer("chatexport")
        self._propagator = TraceparentOnly()

    @contextlib.contextmanager
    def span(
        self,
        name: str,
        *,
        parent: str | None,
        links: Sequence[str],
        root: bool,
        client: bool,
        attributes: SpanAttributes,
    ) -> Iterator[None]:
        """See ``shared.tracing.span``."""
        context = self._context(parent) if parent else Context() if root else None
        if root:
            attributes = {**attributes, ROOT_MARKER: True}
        span_links = [Link(self._span_context(link)) for link in links]
        kind = SpanKind.CLIENT if client else SpanKind.INTERNAL
        with self._tracer.start_as_current_span(
            name,
            context=context,
            links=[link for link in span_links if link.context.is_valid],
            kind=kind,
            attributes=dict(attributes),
        ):
            yield

    def set_attributes(self, attributes: SpanAttributes) -> None:
        """See ``shared.tracing.set_attributes``."""
        current = trace.get_current_span()
        if current.is_recording():
            current.set_attributes(dict(attributes))

    def traceparent(self) -> str | None:
        """See ``shared.tracing.current_traceparent``."""
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier)
        return carrier.get("traceparent")

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """See ``shared.tracing.inject``."""
        self._propagator.inject(headers)

    def log_ids(self) -> dict[str, str]:
        """See ``shared.tracing.log_ids``."""
        ids = trace.get_current_span().get_span_context()
        if not ids.is_valid:
            return {}
        return {"trace_id": trace.format_trace_id(ids.trace_id), "span_id": trace.format_span_id(ids.span_id)}

    def shutdown(self) -> None:
        """Export what is buffered and stop, waiting at most ``SHUTDOWN_SECONDS``: with the collector down
        or silent, the exporter would retry for its whole timeout (10 s), and a part's stop must stay within
        its grace period. Spans not sent by then are lost.
        """
        stopping = threading.Thread(target=self._provider.shutdown, name="tracing-shutdown", daemon=True)
        stopping.start()
        stopping.join(SHUTDOWN_SECONDS)

    def _context(self, traceparent: str) -> Context:
        return self._propagator.extract({"traceparent": traceparent}, Context())

    def _span_context(self, traceparent: str) -> SpanContext:
        return trace.get_current_span(self._context(traceparent)).get_span_context()


def install(service: str, *, edge: bool, environ: MutableMapping[str, str] = os.environ) -> SdkBackend:
    """Set up tracing for this process (see the module's docstring); return the backend ``shared.tracing``
    calls. ``edge``: the api, which continues clients' trace contexts (``PartSampler``) and serves HTTP.
    """
    sanitize_headers(environ)
    environ.setdefault(EXCLUDED_URLS_VARIABLE, DEFAULT_EXCLUDED_URLS)
    # Not shut down at exit by the SDK: ``SdkBackend.shutdown`` does it, with a bound.
    provider = TracerProvider(
        resource=resource(service, environ), sampler=part_sampler(environ, edge=edge), shutdown_on_exit=False
    )
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    propagate.set_global_textmap(TraceparentOnly())
    AsyncPGInstrumentor().instrument(tracer_provider=provider)
    AioPikaInstrumentor().instrument(tracer_provider=provider)
    AiobotocoreInstrumentor().instrument(tracer_provider=provider)
    if edge:
        from opentelemetry.instrumentation.aiohttp_server import AioHttpServerInstrumentor

        AioHttpServerInstrumentor().instrument(tracer_provider=provider)
    return SdkBackend(provider)
