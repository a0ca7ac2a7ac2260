"""Writes the site's OpenAPI reference at build time (mkdocs-gen-files): the document the API serves at
``/v3/openapi.json``, built by the same function, published beside a page that neoteroi's ``[OAD]`` tag
renders from it, so that the reference cannot drift from the service.
"""

from __future__ import annotations

import json

import mkdocs_gen_files

from services.api.openapi import build_document

PAGE = """# OpenAPI document

The HTTP API as the service describes itself: this page is rendered, when the site is built, from the
document every API process serves at `/v3/openapi.json` ([download it](openapi.json)); the running API
also serves it as an interactive page at `/v3/docs`. What each route means, with the choices the document
cannot carry, is in the [API reference](../api.md).

[OAD(./openapi.json)]
"""

with mkdocs_gen_files.open("reference/openapi.json", "w") as document:
    json.dump(build_document(), document, indent=2)
with mkdocs_gen_files.open("reference/openapi.md", "w") as page:
    page.write(PAGE)
