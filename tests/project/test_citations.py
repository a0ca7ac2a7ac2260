"""Every citation of the documentation in the project's code (a page path such as ``docs/api.md``, or the
word ``README``, then a colon) names a real page and a real heading of it, and a real label of that
heading's section when it gives one (docs/development.md: Development, Citations).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.reference import generated_pages

ROOT = Path(__file__).resolve().parents[2]
SUFFIXES = {".py", ".sql", ".js", ".html", ".yml", ".yaml"}
CITE = re.compile(r"(README|docs/[\w/-]+\.md):(?:\s+|$)")
END = re.compile(r"[.;:()\"—]|\*/|-->")
MARKERS = ("#", "--", "//")
MOST_LINES = 4
BUILT = {"site", "build"}  # what `make docs` and a wheel build write
FROZEN = (ROOT / "shared" / "migrations", ROOT / "shared" / "schema.sql")


def sections(readme: str) -> dict[str, set[str]]:
    """Heading text -> the labels a citation may give after it: the bold labels of its section and of its
    subheadings' (``**Label.**`` read as ``Label``) and the subheadings' own text; fenced code is not read.
    """
    found: dict[str, set[str]] = {}
    open_headings: list[tuple[int, str]] = []
    fenced = False
    for line in readme.splitlines():
        fenced ^= line.startswith("```")
        heading = None if fenced else re.match(r"(#+) (.+)", line)
        if heading:
            level = len(heading[1])
            open_headings = [(lvl, text) for lvl, text in open_headings if lvl < level]
            for _, text in open_headings:
                found[text].add(heading[2])
            open_headings.append((level, heading[2]))
            found.setdefault(heading[2], set())
        elif not fenced:
            for label in re.findall(r"\*\*(.+?)\*\*", line):
                for _, text in open_headings:
                    found[text].add(label.rstrip(".: "))
    return found


def _marker(before: str) -> str:
    """The line comment marker the citation sits behind, or ``""`` in a docstring or block comment."""
    places = {marker: before.rfind(marker) for marker in MARKERS}
    marker, place = max(places.items(), key=lambda item: item[1])
    return marker if place >= 0 else ""


def _continues(line: str, marker: str) -> str | None:
    """The text of ``line`` if it carries on the comment or docstring a citation started in, else None."""
    text = line.strip()
    if marker:
        return text[len(marker) :].strip() if text.startswith(marker) else None
    if not text or text.startswith(('"""', "'''")) or text.startswith(MARKERS):
        return None
    return text.lstrip("* ").strip()


def citations(text: str) -> Iterator[tuple[int, str, str]]:
    """``(line number, page, citation)`` for each citation (``CITE``) in ``text``, ``page`` being ``README.md``
    or ``docs/<page>.md``: read on over the following lines of the same comment or docstring until a
    terminator (``END``) or the comment ends.
    """
    lines = text.splitlines()
    for number, line in enumerate(lines):
        for start in CITE.finditer(line):
            marker = _marker(line[: start.start()])
            cited = line[start.end() :]
            for following in lines[number + 1 : number + MOST_LINES]:
                carried = _continues(following, marker)
                if END.search(cited) or carried is None:
                    break
                cited = f"{cited.rstrip()} {carried}"
            page = "README.md" if start[1] == "README" else start[1]
            yield number + 1, page, END.split(cited, maxsplit=1)[0].strip()


def problem(page: str, citation: str, known: dict[str, dict[str, set[str]]]) -> str | None:
    """Why ``citation`` (``<heading>[, <bold label>]``) names nothing on ``page`` (a key of ``known``: its
    ``sections``), or None when it does.
    """
    if page not in known:
        return f"no page {page!r}"
    heading, _, label = citation.partition(", ")
    headings = known[page]
    if heading not in headings:
        return f"no heading {heading!r} on {page}"
    if label and label not in headings[heading]:
        return f"no bold label {label!r} under {heading!r}"
    return None


def project_files() -> Iterator[Path]:
    """The project's own source files that may cite the documentation (not hidden folders, builds or caches)."""
    for path in sorted(ROOT.rglob("*")):
        parts = path.relative_to(ROOT).parts
        if parts[0] in BUILT or any(
            part.startswith(".") or part.endswith(".egg-info") or part == "__pycache__" for part in parts
        ):
            continue
        # An applied migration is never edited, so its comments (and the schema snapshot built from them) cite
        # the README as it was when it was written.
        if path in FROZEN or any(folder in path.parents for folder in FROZEN):
            continue
        if path.is_file() and (path.suffix in SUFFIXES or path.name == "Makefile"):
            yield path


def documentation() -> dict[str, dict[str, set[str]]]:
    """Each page that a citation may name (``README.md``, ``docs/<page>.md``, and the pages the site's build
    generates) -> its ``sections``.
    """
    pages = {"README.md": (ROOT / "README.md").read_text(encoding="utf-8")}
    pages |= {str(path.relative_to(ROOT)): path.read_text(encoding="utf-8") for path in (ROOT / "docs").rglob("*.md")}
    pages |= {f"docs/{name}": text for name, text in generated_pages().items()}
    return {page: sections(text) for page, text in pages.items()}


KNOWN = documentation()

# Written with "R:" and "D:" so that the scan of this file does not read the sample as citations of its own.
SAMPLE = (
    """def f():
    '''Waits (D: API reference,
    Waiting for a change) and answers (D: Nowhere at all).
    '''
    x = 1  # D: API reference, No such
    # label; S: States and failure model
    y = 2  # V: Development, Today's schema: generated
    z = 3  # R: How it works; N: Anything
""".replace("D:", "docs/api.md:")
    .replace("S:", "docs/states.md:")
    .replace("V:", "docs/development.md:")
)
SAMPLE = SAMPLE.replace("R:", "README:").replace("N:", "docs/nowhere.md:")


def test_the_checker_reads_citations_across_lines_and_refuses_made_up_ones() -> None:
    found = [(number, cited, problem(page, cited, KNOWN)) for number, page, cited in citations(SAMPLE)]
    assert found == [
        (2, "API reference, Waiting for a change", None),
        (3, "Nowhere at all", "no heading 'Nowhere at all' on docs/api.md"),
        (5, "API reference, No such label", "no bold label 'No such label' under 'API reference'"),
        (6, "States and failure model", None),
        (7, "Development, Today's schema", None),
        (8, "How it works", None),
        (8, "Anything", "no page 'docs/nowhere.md'"),
    ]


def test_a_subheadings_labels_count_for_its_parent() -> None:
    assert "From the records" in KNOWN["docs/retention.md"]["Retention periods"]


def test_a_citation_at_the_end_of_a_line_is_read_on_the_next() -> None:
    text = "# A rule (docs/states.md:\n# States and failure model).\n"
    assert [(page, cited) for _, page, cited in citations(text)] == [("docs/states.md", "States and failure model")]


@pytest.mark.parametrize("path", list(project_files()), ids=lambda path: str(path.relative_to(ROOT)))
def test_every_citation_names_a_page_heading_and_label(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    wrong = [(number, cited, why) for number, page, cited in citations(text) if (why := problem(page, cited, KNOWN))]
    assert wrong == []
