"""Writes the site's reference pages at build time (mkdocs-gen-files): the settings, the problem codes, the
metrics every part serves and the command line, each generated from the code by ``devtools.reference``, so
that they cannot drift from it.
"""

from __future__ import annotations

import mkdocs_gen_files

from devtools.reference import generated_pages

for path, markdown in generated_pages().items():
    with mkdocs_gen_files.open(path, "w") as page:
        page.write(markdown)
