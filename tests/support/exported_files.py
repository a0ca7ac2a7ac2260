"""What an exported file holds, read back the way its users read it: CSV with Python's csv module, HTML with
an HTML parser (docs/api.md: Submitting an export, Export options).
"""

from __future__ import annotations

import csv
import io
import re
from html.parser import HTMLParser

# Cells a spreadsheet would run, each of which the CSV holds with a leading ' (docs/api.md: Submitting an export, Export
# options): the signs, tab, CR and the guard itself first, then a sign behind a space, a no-break space, a
# line feed, a zero-width space or a BOM, and the full-width sign that NFKC folds to "=".
FORMULAS = [
    "=1+1",
    "+1",
    "-1",
    "@SUM(A1)",
    "\tTab",
    "\rCR",
    "'=1+1",
    " =1+1",
    "\u00a0=1+1",
    "\n=1+1",
    "\uff1d1+1",
    "\u200b=1+1",
    "\ufeff=1+1",
]
BODIES = [
    "hello",
    'quote " and , comma',
    "two\nlines",
    "crlf\r\ninside",
    "<script>alert(1)</script>",
    "&amp; is not &",
    "مرحبا بالعالم",
    "emoji 😀",
    "\u2028",
    *FORMULAS,
]


class Transcript(HTMLParser):
    """The text of every ``<p class="body">`` and every tag and attribute seen."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.bodies: list[str] = []
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self._in_body = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag == "p" and dict(attrs).get("class") == "body":
            self._in_body = True
            self.bodies.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "p":
            self._in_body = False

    def handle_data(self, data: str) -> None:
        if self._in_body:
            self.bodies[-1] += data


def parsed(content: bytes) -> Transcript:
    transcript = Transcript()
    transcript.feed(content.decode("utf-8"))
    transcript.close()
    return transcript


def assert_self_contained(transcript: Transcript) -> None:
    assert not [tag for tag, _ in transcript.tags if tag in ("script", "iframe", "object", "embed", "link", "img")]
    for tag, attrs in transcript.tags:
        assert not {"src", "href"} & attrs.keys(), tag
        assert not [name for name in attrs if name.startswith("on")], tag


def csv_rows(content: bytes) -> list[list[str]]:
    """The rows of a UTF-8 CSV file, header first."""
    return list(csv.reader(io.StringIO(content.decode("utf-8"), newline="")))


# A TXT line: the time in UTC, the sender id (which holds no space) and the body with its escapes.
_TXT_LINE = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}Z)\] (\S+): (.*)")
_TXT_ESCAPE = re.compile(r"\\(\\|n|r|u[0-9a-f]{4})")
_TXT_ESCAPED = {"\\": "\\", "n": "\n", "r": "\r"}


def txt_messages(content: bytes) -> list[tuple[str, str, str]]:
    """(time, sender, body) of each line of a UTF-8 TXT file, as ``str.splitlines()`` splits it; each body
    read back from its escapes. Fails on a line that is not a message.
    """
    messages = []
    for line in content.decode("utf-8").splitlines():
        matched = _TXT_LINE.fullmatch(line)
        assert matched is not None, line
        body = _TXT_ESCAPE.sub(lambda escape: _TXT_ESCAPED.get(escape[1]) or chr(int(escape[1][1:], 16)), matched[3])
        messages.append((matched[1], matched[2], body))
    return messages


def big_bodies(count: int) -> list[str]:
    """``count`` bodies of about 4 KB, some of them formula-like, quoted or markup."""
    starts = ("=", "<b>", '"', "x")
    return [f"{starts[n % 4]}{n:06d} " + "é" * 2000 for n in range(count)]
