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
import logging
import math
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
from opentelemetry.propagators.textmap import Getter, default_getter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider, sampling
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import Attributes

from shared.tracing.attributes import ROOT_MARKER
from shared.tracing.attributes import Attributes as SpanAttributes

log = logging.getLogger(__name__)

# Whatever the environment asks to capture, these headers' values never reach a span: credentials, a
# download's Location, whose query is a presigned URL's signature, and what a client may not send onwards.
ALWAYS_SANITIZED_HEADERS = (
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "location",
    # A client's own text, which goes no further than the edge.
    "tracestate",
    "baggage",
)
SANITIZE_VARIABLE = "OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SANITIZE_FIELDS"
# Probes and scrapes every few seconds would bury the exports' traces. Regular expressions searched in the
# path: anchored, or a conversation id holding "metrics" would go untraced.
EXCLUDED_URLS_VARIABLES = ("OTEL_PYTHON_AIOHTTP_SERVER_EXCLUDED_URLS", "OTEL_PYTHON_EXCLUDED_URLS")
DEFAULT_EXCLUDED_URLS = "^/healthz$,^/readyz$,^/metrics$"
# The values of OTEL_TRACES_SAMPLER the SDK knows (the OpenTelemetry SDK environment variables
# specification); anything else would silently become parentbased_always_on.
STANDARD_SAMPLERS = frozenset(
    {
        "always_on",
        "always_off",
        "traceidratio",
        "parentbased_always_on",
        "parentbased_always_off",
        "parentbased_traceidratio",
    }
)
# How long a stopping part waits for its last spans to be sent (``SdkBackend.shutdown``).
SHUTDOWN_SECONDS = 3.0


class TraceparentOnly(TraceContextTextMapPropagator):
    """W3C trace context, minus ``tracestate``: a client's vendor state is never read (nor logged when
    malformed), and what we store and forward is the ``traceparent`` alone. Baggage is not propagated at all.
    """

    def extract(self, carrier: Any, context: Context | None = None, getter: Any = None) -> Context:
        """The context of the carrier's valid ``traceparent``, with an empty ``tracestate``; ``context`` (or
        an empty one) when there is none or it is malformed (a new trace starts, never an error).
        """
        return super().extract(carrier, context, getter=_WithoutTracestate(getter or default_getter))


class _WithoutTracestate(Getter[Any]):
    """A carrier getter that finds no ``tracestate``."""

    def __init__(self, getter: Any) -> None:
        self._getter = getter

    def get(self, carrier: Any, key: str) -> list[str] | None:
        """The values of header ``key``; none for ``tracestate``."""
        return None if key.lower() == "tracestate" else self._getter.get(carrier, key)

    def keys(self, carrier: Any) -> list[str]:
        """The carrier's keys."""
        return list(self._getter.keys(carrier))


class PartSampler(Sampler):
    """A part's sampler (docs/monitoring.md: Monitoring, Traces).

    Whatever else decides, a span with no parent starts a trace only at an explicit root
    (``shared.tracing.span(root=True)``: a janitor pass, a schedule's fire) or at a request the api serves:
    a driver's span outside any trace (the relay's and janitor's polling queries) is dropped. The rest is
    ``configured``'s decision when the operator named a sampler (``OTEL_TRACES_SAMPLER``); else a span under
    one of our own spans follows its parent's decision, and a new trace is sampled with probability
    ``ratio`` by a random draw here. On the ``edge`` (the api) that draw also decides for a client's
    ``traceparent``, which is continued but whose sampled flag and trace id decide nothing: a client cannot
    force sampling. Elsewhere a remote parent is our own (a stored context, a message's headers).
    """

    def __init__(self, ratio: float, *, edge: bool, configured: Sampler | None = None) -> None:
        self._ratio = ratio
        self._edge = edge
        self._configured = configured

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
        given = attributes or {}
        kept = {key: value for key, value in given.items() if key != ROOT_MARKER}
        parent = trace.get_current_span(parent_context).get_span_context()
        if not parent.is_valid and kind is not SpanKind.SERVER and ROOT_MARKER not in given:
            return SamplingResult(Decision.DROP)
        if self._configured is not None:
            return self._configured.should_sample(parent_context, trace_id, name, kind, kept, links, trace_state)
        if parent.is_valid and not (parent.is_remote and self._edge):
            sampled = parent.trace_flags.sampled
        else:
            sampled = random.random() < self._ratio
        return SamplingResult(Decision.RECORD_AND_SAMPLE if sampled else Decision.DROP, kept if sampled else None)

    def get_description(self) -> str:
        """The sampler's name, as the SDK reports it."""
        inner = self._configured.get_description() if self._configured else f"{self._ratio},edge={self._edge}"
        return f"PartSampler{{{inner}}}"


def part_sampler(environ: Mapping[str, str], *, edge: bool) -> PartSampler:
    """The part's ``PartSampler``: around the SDK's sampler for ``OTEL_TRACES_SAMPLER`` (and its argument)
    when the variable names one of the standard samplers, else at the ratio ``OTEL_TRACES_SAMPLER_ARG``
    (default 1.0). An unknown sampler name, or a ratio that is not a number in [0, 1], is logged and the
    default taken instead.
    """
    name = environ.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    if name in STANDARD_SAMPLERS:
        # The SDK's own reading of the two variables (what TracerProvider() does without a sampler).
        return PartSampler(1.0, edge=edge, configured=sampling._get_from_env_or_default())
    if name:
        log.warning("OTEL_TRACES_SAMPLER names no standard sampler; the default one applies", extra={"sampler": name})
    text = environ.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    try:
        ratio = float(text) if text else 1.0
    except ValueError:
        ratio = math.nan
    if not 0.0 <= ratio <= 1.0:
        log.warning("OTEL_TRACES_SAMPLER_ARG is not a number in [0, 1]; every trace is sampled")
        ratio = 1.0
    return PartSampler(ratio, edge=edge)


def sanitize_headers(environ: MutableMapping[str, str]) -> None:
    """Add ``ALWAYS_SANITIZED_HEADERS`` to the header capture's sanitized fields in ``environ``."""
    asked = [field.strip() for field in environ.get(SANITIZE_VARIABLE, "").split(",") if field.strip()]
    environ[SANITIZE_VARIABLE] = ",".join([*asked, *ALWAYS_SANITIZED_HEADERS])


def exclude_probes(environ: MutableMapping[str, str]) -> None:
    """Keep ``/healthz``, ``/readyz`` and ``/metrics`` out of server spans, unless ``environ`` names the
    excluded URLs itself (``OTEL_PYTHON_AIOHTTP_SERVER_EXCLUDED_URLS`` or ``OTEL_PYTHON_EXCLUDED_URLS``).
    """
    if not any(environ.get(name, "").strip() for name in EXCLUDED_URLS_VARIABLES):
        environ[EXCLUDED_URLS_VARIABLES[0]] = DEFAULT_EXCLUDED_URLS


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
        # An exception's text can quote a URL with its query (aiohttp's do) or a peer's bytes: a failed
        # span records the error's type alone.
        with self._tracer.start_as_current_span(
            name,
            context=context,
            links=[link for link in span_links if link.context.is_valid],
            kind=kind,
            attributes=dict(attributes),
            record_exception=False,
            set_status_on_exception=False,
        ) as current:
            try:
                yield
            except BaseException as exc:
                current.set_status(Status(StatusCode.ERROR))
                current.set_attribute("error.type", type(exc).__qualname__)
                raise

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
    exclude_probes(environ)
    # Not shut down at exit by the SDK: ``SdkBackend.shutdown`` does it, with a bound.
    sampler = part_sampler(environ, edge=edge)
    provider = TracerProvider(resource=resource(service, environ), sampler=sampler, shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    propagate.set_global_textmap(TraceparentOnly())
    AsyncPGInstrumentor().instrument(tracer_provider=provider)
    AioPikaInstrumentor().instrument(tracer_provider=provider)
    AiobotocoreInstrumentor().instrument(tracer_provider=provider)
    if edge:
        from opentelemetry.instrumentation.aiohttp_server import AioHttpServerInstrumentor

        AioHttpServerInstrumentor().instrument(tracer_provider=provider)
    log.info(
        "tracing on",
        extra={"service_name": provider.resource.attributes.get(SERVICE_NAME), "sampler": sampler.get_description()},
    )
    return SdkBackend(provider)
