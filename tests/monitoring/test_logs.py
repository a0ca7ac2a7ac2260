"""JSON log lines: extra fields kept, and request-parser errors never quote what the client sent."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from typing import Any

from aiohttp.http_exceptions import LineTooLong

from shared.logs import JsonFormatter, RedactRequestParseErrors, log_fields, update_log_fields


def emit(logger_name: str, *, extra: dict[str, object] | None = None, exc_info: Any = None) -> dict[str, object]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter("api"))
    handler.addFilter(RedactRequestParseErrors())
    logger = logging.getLogger(logger_name)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.error("Error handling request from %s", "127.0.0.1", extra=extra, exc_info=exc_info)
    finally:
        logger.removeHandler(handler)
    line: dict[str, object] = json.loads(stream.getvalue())
    return line


def test_extra_fields_become_members_of_the_line() -> None:
    line = emit("test.extra", extra={"operation_id": "op_1", "generation": 2})
    assert line["service"] == "api"
    assert line["operation_id"] == "op_1" and line["generation"] == 2
    assert line["msg"] == "Error handling request from 127.0.0.1"


def test_a_parser_error_is_logged_without_the_request_text() -> None:
    try:
        raise LineTooLong(b"Bearer SECRET-TOKEN-VALUE" * 10, 8190)
    except LineTooLong as error:
        line = emit("test.parser", exc_info=(type(error), error, error.__traceback__))
    text = json.dumps(line)
    assert "SECRET-TOKEN-VALUE" not in text
    assert line["msg"] == "bad HTTP request refused: LineTooLong"
    assert "exc" not in line


def test_bound_fields_join_every_line_of_the_block_and_leave_with_it() -> None:
    with log_fields(operation_id="op_1", generation=3, attempt=2, phase="starting"):
        update_log_fields(phase="writing")
        inside = emit("test.bound", extra={"rows": 5})
    after = emit("test.bound")

    assert (inside["operation_id"], inside["generation"], inside["attempt"]) == ("op_1", 3, 2)
    assert (inside["phase"], inside["rows"]) == ("writing", 5)
    assert "operation_id" not in after and "phase" not in after


def test_bound_fields_stay_in_their_own_task() -> None:
    async def export(operation_id: str, started: asyncio.Event, other: asyncio.Event) -> dict[str, object]:
        with log_fields(operation_id=operation_id):
            started.set()
            await other.wait()  # the other task binds its own id meanwhile
            return emit("test.tasks")

    async def both() -> list[dict[str, object]]:
        first, second = asyncio.Event(), asyncio.Event()
        return list(await asyncio.gather(export("op_a", first, second), export("op_b", second, first)))

    lines = asyncio.run(both())

    assert [line["operation_id"] for line in lines] == ["op_a", "op_b"]


def test_a_changed_field_reaches_the_tasks_started_in_the_block() -> None:
    async def attempt() -> dict[str, object]:
        with log_fields(operation_id="op_1", phase="starting"):
            changed = asyncio.Event()

            async def heartbeat() -> dict[str, object]:
                await changed.wait()
                return emit("test.heartbeat")

            beating = asyncio.create_task(heartbeat())
            update_log_fields(phase="uploading")
            changed.set()
            return await beating

    line = asyncio.run(attempt())

    assert (line["operation_id"], line["phase"]) == ("op_1", "uploading")


def test_changing_fields_outside_a_block_binds_nothing() -> None:
    update_log_fields(phase="writing")

    assert "phase" not in emit("test.unbound")
