"""Export options without servers (docs/api.md: Submitting an export, Export options): the canonical request and its
fingerprint, the renderers, and download file names.
"""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from services.api.exporting.results import content_disposition
from services.api.http.schemas import ExportSubmission
from shared.export.fingerprint import fingerprint
from shared.export.rendering import Csv, Html, JsonLines
from shared.repository.export_reader import ExportRow
from tests.support.exported_files import FORMULAS


def canonical(body: dict[str, Any]) -> str:
    request = ExportSubmission.model_validate(body).export_request(notify_url=None)
    return fingerprint(user_id="u-a", conversation_id="c-a", request=request)


@pytest.mark.parametrize(
    "same",
    [
        {"format": "jsonl"},
        {"compression": "none"},
        {"since": None, "until": None, "senders": None, "max_part_bytes": None},
        {"format": "jsonl", "after_seq": 0, "compression": "none"},
    ],
)
def test_an_absent_option_and_its_default_are_the_same_request(same: dict[str, Any]) -> None:
    assert canonical(same) == canonical({})


def test_a_bound_between_milliseconds_is_the_next_whole_one_and_the_window_is_judged_exactly() -> None:
    request = ExportSubmission.model_validate(
        {"since": "2026-03-01T00:00:00.0005Z", "until": "2026-03-01T00:00:00.0009Z"}
    ).export_request(notify_url=None)
    assert request.since == request.until == datetime(2026, 3, 1, 0, 0, 0, 1000, tzinfo=UTC)
    assert canonical({"since": "2026-03-01T00:00:00.0001Z"}) == canonical({"since": "2026-03-01T00:00:00.001Z"})
    with pytest.raises(ValidationError) as refused:
        ExportSubmission.model_validate({"since": "2026-03-01T00:00:00.0009Z", "until": "2026-03-01T00:00:00.0005Z"})
    assert refused.value.errors()[0]["loc"] == ("until",)


def test_times_are_instants_and_senders_a_set() -> None:
    assert canonical({"since": "2026-03-08T01:30:00-05:00"}) == canonical({"since": "2026-03-08T06:30:00.000Z"})
    assert canonical({"until": "2026-03-08T12:00:00+05:30"}) == canonical({"until": "2026-03-08T06:30:00z"})
    assert canonical({"senders": ["b", "a", "b"]}) == canonical({"senders": ["a", "b"]})


@pytest.mark.parametrize(
    "other",
    [
        {"format": "csv"},
        {"format": "html"},
        {"compression": "gzip"},
        {"since": "2026-03-08T06:30:00Z"},
        {"until": "2026-03-08T06:30:00Z"},
        {"senders": ["a"]},
        {"max_part_bytes": 5 * 1024 * 1024},
    ],
)
def test_every_option_changes_the_request(other: dict[str, Any]) -> None:
    assert canonical(other) != canonical({})


@pytest.mark.parametrize(
    "bad",
    [
        {"since": "2026-03-08T06:30:00"},
        {"since": "2026-01-01T00:00:00+05:99"},
        {"since": "2026-01-01T00:00:00+24:00"},
        {"since": "2026-01-01T00:00:60Z"},
        {"since": "0999-03-08T06:30:00Z"},
        {"since": "2026-03-08T06:30:00Z", "until": "2026-03-08T01:30:00-05:00"},
        {"senders": []},
        {"senders": ["x" * 65]},
        {"senders": [f"u{n}" for n in range(101)]},
        {"format": "pdf"},
        {"compression": "br"},
        {"max_part_bytes": 5 * 1024 * 1024 - 1},
        {"zip": True},
    ],
)
def test_bad_options_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ExportSubmission.model_validate(bad)


def row(seq: int, body: str, *, sender: str = "alice", at: str = "2026-11-30T08:00:00") -> ExportRow:
    return ExportRow(seq, f"m{seq}", sender, datetime.fromisoformat(at).replace(tzinfo=UTC), body, f'{{"seq":{seq}}}')


def test_csv_guards_formula_cells_and_quotes_the_rest() -> None:
    rendering = Csv("c-a")
    bodies = [*FORMULAS, 'a "b", c', "two\nlines", "plain"]
    text = rendering.header() + b"".join(rendering.message(row(n, body)) for n, body in enumerate(bodies, 1))
    rows = list(csv.reader(io.StringIO(text.decode(), newline="")))
    assert [r[5] for r in rows[1:]] == ["'" + body for body in FORMULAS] + ['a "b", c', "two\nlines", "plain"]
    assert rows[1][:5] == ["c-a", "1", "m1", "alice", "2026-11-30T08:00:00.000Z"]
    assert text.endswith(b"\r\n") and rendering.footer() == b""


def test_csv_guards_every_text_cell_a_user_chose_not_only_the_body() -> None:
    rendering = Csv("-c")
    text = b"".join(
        rendering.message(ExportRow(n, message_id, "-bob", datetime(2026, 11, 30, tzinfo=UTC), "x", "{}"))
        for n, message_id in enumerate(FORMULAS, 1)
    )
    rows = list(csv.reader(io.StringIO(text.decode(), newline="")))
    assert [(r[0], r[2], r[3], r[5]) for r in rows] == [("'-c", "'" + m, "'-bob", "x") for m in FORMULAS]


def test_html_escapes_groups_by_day_and_closes_every_day() -> None:
    rendering = Html("c-<a>")
    pieces = [
        rendering.header(),
        rendering.message(row(1, "<script>x</script>", at="2026-11-29T23:59:59")),
        rendering.message(row(2, "&", sender="<b>", at="2026-11-30T00:00:00")),
        rendering.footer(),
    ]
    document = b"".join(pieces).decode()
    assert "<script>" not in document and "&lt;script&gt;x&lt;/script&gt;" in document
    assert "c-&lt;a&gt;" in document and "&lt;b&gt;" in document and "&amp;" in document
    assert document.count("<section>") == document.count("</section>") == 2
    assert len(pieces[-1]) <= rendering.footer_at_most


def test_jsonl_renders_the_line_postgres_rendered() -> None:
    assert JsonLines().message(row(7, "x")) == b'{"seq":7}\n'


def test_content_disposition_names_plain_ascii_files_and_others_with_filename_star() -> None:
    assert content_disposition("c-a-2026-11-30.csv.gz") == 'attachment; filename="c-a-2026-11-30.csv.gz"'
    assert content_disposition("café-2026-11-30.jsonl") == (
        "attachment; filename=\"caf_-2026-11-30.jsonl\"; filename*=UTF-8''caf%C3%A9-2026-11-30.jsonl"
    )
    assert content_disposition('a"b.jsonl').startswith('attachment; filename="a_b.jsonl"; filename*=')
