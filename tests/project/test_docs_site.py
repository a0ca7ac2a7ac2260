"""The OpenAPI page of the docs site renders as the site builds it (docs/development.md: Development, The
docs site): neoteroi's Markdown for the served document, through the Markdown extensions of
``mkdocs.yml``, leaves no tab or admonition markup unrendered (a missing extension shows it as text, which
``mkdocs build --strict`` does not call a warning).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import markdown
import yaml
from openapidocs.mk.v3 import OpenAPIV3DocumentationHandler

from services.api.http.openapi import build_document

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
