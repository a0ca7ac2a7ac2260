"""The plain-text format ``txt`` (docs/api.md: Submitting an export, Export options): one line per message,
``[2026-03-01 12:30:00.000Z] alice: body`` in UTC, bodies escaped so that ``str.splitlines()`` counts messages
and the escapes read back to the body.
"""

from __future__ import annotations

import sys
import unicodedata
from datetime import UTC, datetime

import pytest

from shared.export.formats import FORMATS, FileKind
from shared.export.rendering import Text
from shared.repository.export_reader import ExportRow
from tests.support.exported_files import txt_messages

NOON = datetime(2026, 3, 1, 12, 30, tzinfo=UTC)
# Every character str.splitlines() ends a line at, found by asking it of each one.
LINE_BREAKS = [char for char in map(chr, range(sys.maxunicode + 1)) if len(f"a{char}b".splitlines()) > 1]


def rendered(*bodies: str, at: datetime = NOON) -> bytes:
    """A TXT file of ``bodies``, one message each, sent by alice at ``at``."""
    return b"".join(Text().message(ExportRow(n, f"m{n}", "alice", at, body, "{}")) for n, body in enumerate(bodies))


def test_a_message_is_one_line_with_its_time_in_utc_and_its_sender() -> None:
    at = datetime.fromisoformat("2026-03-01T13:30:00.123+01:00")
    assert rendered("body", at=at) == b"[2026-03-01 12:30:00.123Z] alice: body\n"


def test_the_file_has_no_header_no_footer_and_is_plain_text() -> None:
    renderer = FORMATS["txt"].renderer("c-a")
    assert renderer.header() == renderer.footer() == b""
    assert FileKind("txt").content_type == "text/plain; charset=utf-8"
    assert (FileKind("txt").extension, FileKind("txt", "gzip").extension) == ("txt", "txt.gz")


@pytest.mark.parametrize(
    ("body", "written"),
    [
        ("a\\b", "a\\\\b"),
        ("two\nlines", "two\\nlines"),
        ("crlf\r\nend", "crlf\\r\\nend"),
        ("\\n is not a line feed", "\\\\n is not a line feed"),
        ("tab\tstays, as do é, 😀 and \\u2028 typed out", "tab\tstays, as do é, 😀 and \\\\u2028 typed out"),
        ("\u2028\u2029\x85\x0b\x0c\x1c\x1d\x1e", "\\u2028\\u2029\\u0085\\u000b\\u000c\\u001c\\u001d\\u001e"),
    ],
)
def test_backslashes_and_line_breaks_in_a_body_are_escaped(body: str, written: str) -> None:
    assert rendered(body).decode() == f"[2026-03-01 12:30:00.000Z] alice: {written}\n"


def test_every_character_splitlines_breaks_at_is_escaped_and_reads_back() -> None:
    assert len(LINE_BREAKS) == 10  # LF, CR, VT, FF, FS, GS, RS, NEL, LS, PS
    bodies = [*LINE_BREAKS, "x".join(LINE_BREAKS) + "\\", "\r\n", "", ": starts like a separator"]
    content = rendered(*bodies)
    assert content.endswith(b"\n") and content.count(b"\n") == len(bodies)
    assert txt_messages(content) == [("2026-03-01 12:30:00.000Z", "alice", body) for body in bodies]


# What the docs name: the C0 controls but tab, DEL, the C1 controls, and the bidirectional embedding (U+202A,
# U+202B), pop (U+202C), override (U+202D, U+202E) and isolate (U+2066 to U+2069) controls; counted here from
# Unicode's categories rather than copied from the code.
CONTROLS = [chr(code) for code in range(0x100) if unicodedata.category(chr(code)) == "Cc" and chr(code) != "\t"]
BIDI_CONTROLS = [
    char
    for char in map(chr, range(0x2000, 0x2070))
    if unicodedata.bidirectional(char) in {"LRE", "RLE", "PDF", "LRO", "RLO", "LRI", "RLI", "FSI", "PDI"}
]


def test_terminal_controls_and_bidirectional_overrides_are_escaped_and_read_back() -> None:
    assert len(CONTROLS) == 64 and len(BIDI_CONTROLS) == 9  # 31 C0 but tab, DEL, 32 C1; 5 + 4 bidi controls
    bodies = [
        "\x1b[31mred\x1b[0m and \x1b]0;title\x07 and \x9b2J",  # colour, a window title, a C1 CSI
        "\u202eevil\u202c and \u2067isolated\u2069",
        "".join(CONTROLS + BIDI_CONTROLS),
    ]
    content = rendered(*bodies)
    text = content.decode()
    assert not any(char in text for char in CONTROLS if char != "\n")
    assert not any(char in text for char in BIDI_CONTROLS)
    assert "\\u001b[31mred\\u001b[0m" in text and "\\u009b2J" in text and "\\u202eevil\\u202c" in text
    assert txt_messages(content) == [("2026-03-01 12:30:00.000Z", "alice", body) for body in bodies]


def test_what_a_terminal_does_not_act_on_stays_as_written() -> None:
    kept = "tab\t, no-break\u00a0space, soft\u00adhyphen, zero\u200bwidth, marks \u200e\u200f, עברית, 😀"
    assert rendered(kept).decode() == f"[2026-03-01 12:30:00.000Z] alice: {kept}\n"
