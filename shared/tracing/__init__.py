"""Distributed tracing in the OpenTelemetry format, off unless an OTLP endpoint is set (docs/monitoring.md: Monitoring,
Traces).

This module is what the parts call, and it never imports OpenTelemetry: with tracing off each call is a
check of one global and idle memory stays as it was. ``traced`` starts tracing when
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set and ``OTEL_SDK_DISABLED``
is not ``true``; only then is ``shared.tracing.sdk`` imported, with the SDK and the instrumentations.

A trace context crosses our own boundaries as a W3C ``traceparent`` string (https://www.w3.org/TR/trace-context/):
stored with an operation by the submit and with a schedule by its creation, read back by every part that
wakes the operation, so a retry, a re-enqueue or a cancel carries the submit's trace.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from typing import Protocol

from shared.tracing.attributes import (
    ATTEMPT,
    GENERATION,
    OPERATION_ID,
    ROOT_MARKER,
    SCHEDULE_ID,
    Attributes,
)

__all__ = ["ATTEMPT", "GENERATION", "OPERATION_ID", "ROOT_MARKER", "SCHEDULE_ID", "Attributes"]

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


class Backend(Protocol):
    """What ``shared.tracing.sdk`` provides once tracing is on; see the functions of this module."""

    def span(
        self, name: str, *, parent: str | None, links: Sequence[str], root: bool, client: bool, attributes: Attributes
    ) -> contextlib.AbstractContextManager[None]: ...

    def set_attributes(self, attributes: Attributes) -> None: ...

    def traceparent(self) -> str | None: ...

    def inject(self, headers: MutableMapping[str, str]) -> None: ...

    def log_ids(self) -> dict[str, str]: ...

    def shutdown(self) -> None: ...


_backend: Backend | None = None


def configured(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``environ`` asks for tracing: an OTLP endpoint set, and ``OTEL_SDK_DISABLED`` not ``true``."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(environ.get(name, "").strip() for name in ENDPOINT_VARIABLES)


def enabled() -> bool:
    """Whether tracing is on in this process."""
    return _backend is not None


@contextlib.contextmanager
def traced(service: str, *, edge: bool = False) -> Iterator[None]:
    """Trace the block when ``configured()``: spans are exported over OTLP as ``chatexport-<service>`` (or
    ``OTEL_SERVICE_NAME``) and flushed when the block ends. ``edge``: the process takes trace contexts from
    clients (the api), whose sampled flag the default sampler then ignores (docs/monitoring.md: Monitoring, Traces).
    """
    global _backend
    if not configured():
        yield
        return
    from shared.tracing import sdk

    _backend = sdk.install(service, edge=edge)
    try:
        yield
    finally:
        _backend.shutdown()
        _backend = None


@contextlib.contextmanager
def span(
    name: str,
    *,
    parent: str | None = None,
    links: Sequence[str | None] = (),
    root: bool = False,
    client: bool = False,
    attributes: Attributes | None = None,
) -> Iterator[None]:
    """Run the block in a new current span ``name`` with ``attributes``; with tracing off, just run it.

    Its parent is the ``parent`` traceparent when given (an invalid one is ignored), else none when ``root``,
    else the current span. ``links`` are traceparents of related spans (None ones are skipped); ``client``:
    the span is an outgoing request's (kind CLIENT).
    """
    if _backend is None:
        yield
        return
    valid_links = [link for link in links if link]
    with _backend.span(name, parent=parent, links=valid_links, root=root, client=client, attributes=attributes or {}):
        yield


def set_attributes(**attributes: str | int | float | bool) -> None:
    """Set ``attributes`` on the current span (with tracing off, or outside a span, nothing happens)."""
    if _backend is not None:
        _backend.set_attributes(attributes)


def current_traceparent() -> str | None:
    """The current span's context as a ``traceparent`` value; None with tracing off or outside a span."""
    return None if _backend is None else _backend.traceparent()


def inject(headers: MutableMapping[str, str]) -> None:
    """Add the current span's ``traceparent`` to ``headers`` (an outgoing request's); nothing with tracing off."""
    if _backend is not None:
        _backend.inject(headers)


def log_ids() -> dict[str, str]:
    """``trace_id`` and ``span_id`` (lowercase hex) of the current span, for a log line; {} outside a span."""
    return {} if _backend is None else _backend.log_ids()
