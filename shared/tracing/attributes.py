"""The names our spans' attributes go by (docs/monitoring.md: Monitoring, Traces): dashboards and queries rely on
them, so they change only with a release note.
"""

from __future__ import annotations

from collections.abc import Mapping

OPERATION_ID = "chatexport.operation_id"
GENERATION = "chatexport.generation"
ATTEMPT = "chatexport.attempt"
SCHEDULE_ID = "chatexport.schedule_id"
# Marks a span that may start a trace (``shared.tracing.span(root=True)``) for the default sampler, which
# does not keep it on the span.
ROOT_MARKER = "chatexport.trace_root"

Attributes = Mapping[str, str | int | float | bool]
