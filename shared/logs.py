"""Structured JSON log lines on stderr, one object a line, with the ``extra={...}`` fields of each call
and the fields bound to the current task by ``log_fields`` (operation id, attempt, generation, phase).

Callers put ids, states, counts and durations in ``extra``; never a message body, a token or a signed URL
(docs/api.md: Error codes).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from types import MappingProxyType

from aiohttp.http_exceptions import HttpProcessingError

from shared import jsontext, tracing
from shared.settings import CommonSettings

# Fields every line logged inside a ``log_fields`` block carries, from its task and the tasks started in
# it. Each block has a dict of its own, shared with those tasks, so a change (a new phase) reaches them.
_BOUND: contextvars.ContextVar[Mapping[str, object]] = contextvars.ContextVar(
    "chatexport_log_fields", default=MappingProxyType({})
)


@contextlib.contextmanager
def log_fields(**fields: object) -> Iterator[None]:
    """Add ``fields`` to every line logged inside the block by this task and the tasks it starts."""
    token = _BOUND.set({**_BOUND.get(), **fields})
    try:
        yield
    finally:
        _BOUND.reset(token)


def update_log_fields(**fields: object) -> None:
    """Change fields of the enclosing ``log_fields`` block (a new ``phase``, say), for every task that
    shares it, until the block ends; outside any block, nothing is bound and nothing changes.
    """
    bound = _BOUND.get()
    if isinstance(bound, dict):
        bound.update(fields)


# Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys()) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """Format a record as one JSON object: time, level, service, logger, msg and the extra fields."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self._service = service

    def format(self, record: logging.LogRecord) -> str:
        """Return the JSON line for ``record``."""
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "service": self._service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(_BOUND.get())
        # Inside a span the line names it, so a trace viewer and the logs meet (docs/monitoring.md: Monitoring, Traces).
        entry.update(tracing.log_ids())
        entry.update({key: value for key, value in vars(record).items() if key not in _STANDARD})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return jsontext.dumps(entry, default=str)


class RedactRequestParseErrors(logging.Filter):
    """Strip the text of HTTP parser errors, which quotes the offending request line or header (a token,
    say) verbatim; keep only the error's class name.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite ``record`` in place when it carries a parser error; never drop it."""
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError):
            record.msg, record.args, record.exc_info = "bad HTTP request refused: %s", (type(error).__name__,), None
        return True


def configure_logging(settings: CommonSettings, *, service: str) -> None:
    """Send every logger's records to stderr as JSON lines at ``settings.log_level``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    handler.addFilter(RedactRequestParseErrors())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level.upper())
    # Third-party chatter at INFO would drown the service's own lines.
    for noisy in ("aiormq", "aio_pika", "botocore", "aiobotocore", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
