"""The OpenAPI page of the docs site renders as the site builds it (docs/development.md: Development, The
docs site): neoteroi's Markdown for the served document, through the Markdown extensions of
``mkdocs.yml``, leaves no tab or admonition markup unrendered (a missing extension shows it as text, which
``mkdocs build --strict`` does not call a warning). The home page links every page of the navigation, and a
page that points to a section of the README names one it has (the README's old sections moved to the site).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import markdown
import yaml
from openapidocs.mk.v3 import OpenAPIV3DocumentationHandler

from services.api.openapi import build_document

ROOT = Path(__file__).resolve().parents[2]


def site_markdown() -> markdown.Markdown:
    """A Markdown converter with the extensions (and their options) that ``mkdocs.yml`` names."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    names: list[str] = []
    options: dict[str, Any] = {}
    for entry in config["markdown_extensions"]:
        name, settings = next(iter(entry.items())) if isinstance(entry, dict) else (entry, None)
        names.append(name)
        if settings:
            options[name] = settings
    return markdown.Markdown(extensions=names, extension_configs=options)


def test_the_openapi_page_has_no_unrendered_markup() -> None:
    source = OpenAPIV3DocumentationHandler(json.loads(json.dumps(build_document())), style="MKDOCS").write()
    html = site_markdown().convert(source)
    assert "tabbed-set" in html
    assert re.findall(r"^(?:<p>)?(?:===|\?\?\?) ", html, flags=re.MULTILINE) == []


def nav_pages(entries: list[Any]) -> list[str]:
    """The page paths of an ``mkdocs.yml`` ``nav`` (titled entries, sections nested to any depth)."""
    pages: list[str] = []
    for entry in entries:
        target = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += nav_pages(target) if isinstance(target, list) else [target]
    return pages


def test_the_home_page_links_every_page_of_the_navigation() -> None:
    nav = nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"])
    linked = set(re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", (ROOT / "docs" / "index.md").read_text(encoding="utf-8")))
    assert {"api.md", "reference/cli.md"} <= set(nav)
    assert [page for page in nav if page != "index.md" and page not in linked] == []


# A pointer to a README section, the word and its colon written apart so that the citation check skips it.
README_POINTER = re.compile(r"\(README" r": ([^)]+)\)")


def test_a_page_that_points_to_the_readme_names_one_of_its_headings() -> None:
    headings = set(re.findall(r"^#+ (.+)$", (ROOT / "README.md").read_text(encoding="utf-8"), flags=re.MULTILINE))
    pointers = [
        (page.name, pointer)
        for page in sorted((ROOT / "docs").rglob("*.md"))
        for pointer in README_POINTER.findall(" ".join(page.read_text(encoding="utf-8").split()))
    ]
    assert [(page, pointer) for page, pointer in pointers if pointer not in headings] == []
