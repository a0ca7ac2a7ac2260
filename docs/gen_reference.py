"""Writes the site's reference pages at build time (mkdocs-gen-files): the settings, the problem codes, the
metrics every part serves and the command line, each generated from the code by ``devtools.reference``, so
that they cannot drift from it; and the API reference with its table of every route in place of its
placeholder line.
"""

from __future__ import annotations

import mkdocs_gen_files

from devtools.reference import ENDPOINTS_PAGE, generated_pages, with_endpoint_table

for path, markdown in generated_pages().items():
    with mkdocs_gen_files.open(path, "w") as page:
        page.write(markdown)

with mkdocs_gen_files.open(ENDPOINTS_PAGE, "r") as page:
    source = page.read()
with mkdocs_gen_files.open(ENDPOINTS_PAGE, "w") as page:
    page.write(with_endpoint_table(source))
