"""Tracing's rules without servers (docs/monitoring.md: Monitoring, Traces): off unless an endpoint is set, and then
nothing of OpenTelemetry imported; the default sampler's decisions; the edge's propagation; log lines
inside a span name it.
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider, sampling
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, StatusCode, TraceFlags
from opentelemetry.util.http import ExcludeList

from shared import tracing
from shared.logs import JsonFormatter
from shared.tracing import sdk

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
SPAN_ID = 0xB7AD6B7169203331


def remote(*, sampled: bool) -> Context:
    flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
    return trace.set_span_in_context(NonRecordingSpan(SpanContext(TRACE_ID, SPAN_ID, True, flags)))


def local(*, sampled: bool) -> Context:
    flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
    return trace.set_span_in_context(NonRecordingSpan(SpanContext(TRACE_ID, SPAN_ID, False, flags)))


def decide(sampler: sdk.PartSampler, parent: Context | None, **kwargs: object) -> bool:
    result = sampler.should_sample(parent, TRACE_ID, "span", **kwargs)  # type: ignore[arg-type]
    return result.decision is Decision.RECORD_AND_SAMPLE


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": " "}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "TRUE"}, False),
    ],
)
def test_tracing_is_on_only_with_an_endpoint(environ: dict[str, str], expected: bool) -> None:
    assert tracing.configured(environ) is expected


def test_without_an_endpoint_no_part_imports_opentelemetry() -> None:
    program = (
        "import sys, os\n"
        "from shared import tracing\n"
        "import services.api.app, services.relay.main, services.worker.main, services.janitor.main\n"
        "with tracing.traced('api', edge=True):\n"
        "    with tracing.span('x', root=True):\n"
        "        assert tracing.current_traceparent() is None and tracing.log_ids() == {}\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": "."}
    output = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, check=True)
    assert output.stdout.strip() == "[]", output


def test_a_client_cannot_force_sampling_at_the_edge() -> None:
    never = sdk.PartSampler(0.0, edge=True)
    assert not decide(never, remote(sampled=True), kind=SpanKind.SERVER)
    always = sdk.PartSampler(1.0, edge=True)
    assert decide(always, remote(sampled=False), kind=SpanKind.SERVER)
    # Under the api's own span, its decision holds.
    assert decide(never, local(sampled=True)) and not decide(always, local(sampled=False))


def test_behind_the_edge_our_own_contexts_decide() -> None:
    part = sdk.PartSampler(1.0, edge=False)
    assert decide(part, remote(sampled=True)) and not decide(part, remote(sampled=False))
    # A driver's span outside any trace (a polling query) starts none; an explicit root does.
    assert not decide(part, None, kind=SpanKind.CLIENT)
    result = part.should_sample(None, TRACE_ID, "janitor pass", attributes={tracing.ROOT_MARKER: True, "a": 1})
    assert result.decision is Decision.RECORD_AND_SAMPLE and dict(result.attributes or {}) == {"a": 1}


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, "PartSampler{1.0,edge=True}"),
        ({"OTEL_TRACES_SAMPLER_ARG": "0.25"}, "PartSampler{0.25,edge=True}"),
        ({"OTEL_TRACES_SAMPLER_ARG": "7"}, "PartSampler{1.0,edge=True}"),
        ({"OTEL_TRACES_SAMPLER_ARG": "10%"}, "PartSampler{1.0,edge=True}"),
        ({"OTEL_TRACES_SAMPLER_ARG": "nan"}, "PartSampler{1.0,edge=True}"),
        ({"OTEL_TRACES_SAMPLER": "bogus", "OTEL_TRACES_SAMPLER_ARG": "0"}, "PartSampler{0.0,edge=True}"),
        ({"OTEL_TRACES_SAMPLER": "always_off"}, "PartSampler{AlwaysOffSampler}"),
        (
            {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5"},
            "PartSampler{ParentBased{root:TraceIdRatioBased{0.5},remoteParentSampled:AlwaysOnSampler,"
            "remoteParentNotSampled:AlwaysOffSampler,localParentSampled:AlwaysOnSampler,"
            "localParentNotSampled:AlwaysOffSampler}}",
        ),
    ],
)
def test_the_sampler_follows_the_standard_variables(
    environ: dict[str, str], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SDK reads its own sampler's variables from the process's environment.
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert sdk.part_sampler(environ, edge=True).get_description() == expected


def test_a_named_sampler_still_starts_no_trace_at_a_polling_query() -> None:
    configured = sdk.PartSampler(1.0, edge=False, configured=sampling.ALWAYS_ON)
    assert not decide(configured, None, kind=SpanKind.CLIENT)
    assert decide(configured, None, kind=SpanKind.SERVER) and decide(configured, remote(sampled=False))


@pytest.mark.parametrize(
    "header",
    [
        "00-zz-not-a-context-01",
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",
        "ff-" + "a" * 32 + "-" + "b" * 16 + "-01",
        "",
    ],
)
def test_a_malformed_traceparent_is_no_parent(header: str) -> None:
    context = sdk.TraceparentOnly().extract({"traceparent": header})
    assert not trace.get_current_span(context).get_span_context().is_valid


def test_the_edge_keeps_the_traceparent_and_drops_tracestate() -> None:
    carrier = {"traceparent": f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01", "tracestate": "vendor=value"}
    extracted = trace.get_current_span(sdk.TraceparentOnly().extract(carrier)).get_span_context()
    assert (extracted.trace_id, extracted.span_id, extracted.trace_flags.sampled) == (TRACE_ID, SPAN_ID, True)
    assert len(extracted.trace_state) == 0


def test_credentials_are_sanitised_whatever_the_environment_says() -> None:
    environ = {sdk.SANITIZE_VARIABLE: "x-session"}
    sdk.sanitize_headers(environ)
    fields = environ[sdk.SANITIZE_VARIABLE].split(",")
    assert {"x-session", "authorization", "cookie", "location", "tracestate", "baggage"} <= set(fields)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, sdk.DEFAULT_EXCLUDED_URLS),
        ({"OTEL_PYTHON_EXCLUDED_URLS": "/ping"}, None),
        ({"OTEL_PYTHON_AIOHTTP_SERVER_EXCLUDED_URLS": "/ping"}, "/ping"),
    ],
)
def test_probes_are_not_traced_unless_the_environment_says_otherwise(
    environ: dict[str, str], expected: str | None
) -> None:
    sdk.exclude_probes(environ)
    assert environ.get("OTEL_PYTHON_AIOHTTP_SERVER_EXCLUDED_URLS") == expected
    if expected == sdk.DEFAULT_EXCLUDED_URLS:
        excluded = ExcludeList(expected.split(","))
        assert excluded.url_disabled("/readyz") and excluded.url_disabled("/metrics")
        assert not excluded.url_disabled("/v3/conversations/metrics-team/exports")
        assert not excluded.url_disabled("/v3/conversations/healthz/exports")


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, "chatexport-relay"),
        ({"OTEL_SERVICE_NAME": "relay-eu"}, "relay-eu"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "service.name=custom,region=eu"}, "custom"),
    ],
)
def test_the_service_name(environ: dict[str, str], expected: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert sdk.resource("relay", environ).attributes["service.name"] == expected


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """Tracing on in this process, on a provider of the test's own (the global one is never set here)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sdk.PartSampler(1.0, edge=False))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_backend", sdk.SdkBackend(provider))
    yield exporter
    provider.shutdown()


def test_spans_continue_a_stored_context_and_link_to_others(backend: InMemorySpanExporter) -> None:
    stored = f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01"
    other = f"00-{'1' * 32}-{'2' * 16}-01"
    with tracing.span("outbox publish", parent=stored, attributes={tracing.OPERATION_ID: "op-1"}):
        inner = tracing.current_traceparent()
    with tracing.span("cancel operation", root=True, links=[other, None, "garbage"]):
        pass
    publish, cancel = backend.get_finished_spans()
    assert publish.context is not None and publish.parent is not None
    assert (publish.context.trace_id, publish.parent.span_id) == (TRACE_ID, SPAN_ID)
    assert inner == f"00-{TRACE_ID:032x}-{publish.context.span_id:016x}-01"
    assert dict(publish.attributes or {}) == {tracing.OPERATION_ID: "op-1"}
    assert cancel.parent is None and [link.context.trace_id for link in cancel.links] == [int("1" * 32, 16)]


def test_a_failed_span_records_the_error_type_and_not_its_text(backend: InMemorySpanExporter) -> None:
    with pytest.raises(ValueError), tracing.span("callback POST", root=True):
        raise ValueError("400, url='http://receiver/hook?token=secret'")
    (span,) = backend.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR and span.status.description is None
    assert dict(span.attributes or {}) == {"error.type": "ValueError"} and not span.events


def test_a_log_line_inside_a_span_names_it(backend: InMemorySpanExporter) -> None:
    formatter = JsonFormatter("worker")
    record = logging.LogRecord("test", logging.INFO, __file__, 1, "inside", (), None)
    assert "trace_id" not in json.loads(formatter.format(record))
    with tracing.span("export", root=True):
        line = json.loads(formatter.format(record))
    (span,) = backend.get_finished_spans()
    assert span.context is not None
    assert (line["trace_id"], line["span_id"]) == (f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}")


def test_a_silent_collector_does_not_hold_up_a_stop() -> None:
    # A collector that accepts connections and never answers: the exporter would wait its whole timeout.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}/v1/traces"
        provider = TracerProvider(shutdown_on_exit=False)
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, timeout=60)))
        backend = sdk.SdkBackend(provider)
        with backend.span("export", parent=None, links=[], root=True, client=False, attributes={}):
            pass
        started = time.monotonic()
        backend.shutdown()
        assert time.monotonic() - started < sdk.SHUTDOWN_SECONDS + 5
