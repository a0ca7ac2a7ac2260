"""The format registry (docs/api.md: Submitting an export, Export options) is the one list of formats: every entry
renders, names its file, and the message shape is the same in the read API, the JSONL line and the CSV header.
"""

from __future__ import annotations

import csv
import io
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from services.api.http.schemas import ExportSubmission, Message, OperationRequest
from shared.export.formats import CONTENT_TYPES, FORMAT_NAMES, FORMATS, FileKind
from shared.export.message_shape import FIELDS
from shared.export.rendering import JSONL_LINE_SQL, Csv
from shared.repository.export_reader import ExportRow

API_PAGE = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_every_format_renders_and_names_its_file(name: str) -> None:
    entry = FORMATS[name]
    renderer = entry.renderer("c-a")
    assert renderer.footer() == b"" or len(renderer.footer()) <= renderer.footer_at_most
    # The command-line client names a file after its format (docs/command-line.md: Command-line client).
    assert FileKind(name).extension == name
    assert FileKind(name, "gzip").extension == f"{name}.gz"
    assert entry.content_type in CONTENT_TYPES and entry.description


def test_the_api_takes_and_shows_exactly_the_registered_formats() -> None:
    for model in (ExportSubmission, OperationRequest):
        assert model.model_json_schema()["properties"]["format"]["enum"] == list(FORMAT_NAMES)
    assert len(set(CONTENT_TYPES)) == len(CONTENT_TYPES)


def test_the_read_api_the_jsonl_line_and_the_csv_header_show_the_same_fields() -> None:
    assert tuple(Message.model_fields) == FIELDS
    assert tuple(re.findall(r'"(\w+)":', JSONL_LINE_SQL)) == FIELDS
    assert next(csv.reader(io.StringIO(Csv("c-a").header().decode()))) == list(FIELDS)


def test_the_readme_names_every_format_in_the_option_table() -> None:
    row = next(line for line in API_PAGE.splitlines() if line.startswith("  | `format` |"))
    offered = row.split("|")[3].split(";")[0]
    assert re.findall(r"`(\w+)`", offered) == list(FORMAT_NAMES)


@pytest.mark.parametrize("name", FORMAT_NAMES)
@pytest.mark.parametrize("cut", [1, 2, 3, 4])
def test_a_file_rendered_in_two_pieces_is_the_file_rendered_whole(name: str, cut: int) -> None:
    # Messages on two days; the second piece goes on from the first's last message, as a chunk does
    # (docs/chunks.md: Chunked exports).
    rows = [
        ExportRow(seq, f"m{seq}", "alice", datetime(2026, 3, 1 + seq // 3, 23, seq, tzinfo=UTC), f"body {seq}", "{}")
        for seq in range(1, 6)
    ]
    whole = FORMATS[name].renderer("c-a")
    expected = whole.header() + b"".join(map(whole.message, rows)) + whole.footer()
    first, second = FORMATS[name].renderer("c-a"), FORMATS[name].renderer("c-a")
    second.continue_after(rows[cut - 1])
    pieces = first.header() + b"".join(map(first.message, rows[:cut]))
    pieces += b"".join(map(second.message, rows[cut:])) + second.footer()
    assert pieces == expected
    assert second.carries_over == (name == "html")


# What TXT escapes for terminals (shared.export.rendering.TERMINAL_CONTROLS): the other formats keep it as written.
CONTROLLING = "\x1b[31mred\x1b[0m \x9b2J \x7f \u202eevil\u202c \u2067isolated\u2069"


def test_csv_keeps_terminal_controls_in_the_cell_as_written() -> None:
    renderer = FORMATS["csv"].renderer("c-a")
    row = ExportRow(1, "m1", "alice", datetime(2026, 3, 1, tzinfo=UTC), CONTROLLING, "{}")
    content = (renderer.header() + renderer.message(row)).decode()
    header, line = csv.reader(io.StringIO(content, newline=""))
    assert line[header.index("body")] == CONTROLLING


def test_html_keeps_terminal_controls_inside_an_isolated_element() -> None:
    renderer = FORMATS["html"].renderer("c-a")
    row = ExportRow(1, "m1", "alice", datetime(2026, 3, 1, tzinfo=UTC), CONTROLLING, "{}")
    content = renderer.message(row).decode()
    # dir="auto" makes the element a bidirectional isolate: an override left open ends with it.
    assert re.search(f'<p class="body" dir="auto">{re.escape(CONTROLLING)}</p>', content)
