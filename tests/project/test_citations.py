"""Every citation of the README in the project's code names a real heading, and a real label of that
heading's section when it gives one (README: Development, Citations).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUFFIXES = {".py", ".sql", ".js", ".html", ".yml", ".yaml"}
CITE = re.compile(r"README:\s+")
END = re.compile(r"[.;:()\"—]|\*/|-->")
MARKERS = ("#", "--", "//")
MOST_LINES = 4


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


def citations(text: str) -> Iterator[tuple[int, str]]:
    """``(line number, citation)`` for each citation (``CITE``) in ``text``: read on over the following lines
    of the same comment or docstring until a terminator (``END``) or the comment ends.
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
            yield number + 1, END.split(cited, maxsplit=1)[0].strip()


def problem(citation: str, known: dict[str, set[str]]) -> str | None:
    """Why ``citation`` (``<heading>[, <bold label>]``) names nothing in the README, or None when it does."""
    heading, _, label = citation.partition(", ")
    if heading not in known:
        return f"no heading {heading!r}"
    if label and label not in known[heading]:
        return f"no bold label {label!r} under {heading!r}"
    return None


def project_files() -> Iterator[Path]:
    """The project's own source files that may cite the README (not hidden folders, builds or caches)."""
    for path in sorted(ROOT.rglob("*")):
        parts = path.relative_to(ROOT).parts
        if any(part.startswith(".") or part.endswith(".egg-info") or part == "__pycache__" for part in parts):
            continue
        if path.is_file() and (path.suffix in SUFFIXES or path.name == "Makefile"):
            yield path


README_SECTIONS = sections((ROOT / "README.md").read_text(encoding="utf-8"))

# Written with "R:" so that the scan of this file does not read the sample as citations of its own.
SAMPLE = """def f():
    '''Waits (R: API reference,
    Waiting for a change) and answers (R: Nowhere at all).
    '''
    x = 1  # R: API reference, No such
    # label; R: States and failure model
    y = 2  # R: Development, Today's schema: generated
""".replace("R:", "README:")


def test_the_checker_reads_citations_across_lines_and_refuses_made_up_ones() -> None:
    found = [(number, cited, problem(cited, README_SECTIONS)) for number, cited in citations(SAMPLE)]
    assert found == [
        (2, "API reference, Waiting for a change", None),
        (3, "Nowhere at all", "no heading 'Nowhere at all'"),
        (5, "API reference, No such label", "no bold label 'No such label' under 'API reference'"),
        (6, "States and failure model", None),
        (7, "Development, Today's schema", None),
    ]


def test_a_subheadings_labels_count_for_its_parent() -> None:
    assert "From the records" in README_SECTIONS["Retention periods"]


@pytest.mark.parametrize("path", list(project_files()), ids=lambda path: str(path.relative_to(ROOT)))
def test_every_citation_names_a_readme_heading_and_label(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    wrong = [(number, cited, why) for number, cited in citations(text) if (why := problem(cited, README_SECTIONS))]
    assert wrong == []
