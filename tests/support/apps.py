"""Letting go of the aiohttp applications a test built.

aiohttp keeps every application's middleware chain in a process-wide ``functools.lru_cache`` of 1,024
entries keyed on the application (``aiohttp.web_app._cached_build_middleware``, aiohttp PR 9158): right for a
server that builds one application for its life, but a test session builds hundreds, and each entry holds
its application with its S3 clients and their service models (about 25 MB) alive until 1,024 newer ones
push it out. A session then grew past 10 GB, and a machine short of memory failed later tests in ways that
had nothing to do with them.
"""

from __future__ import annotations

from aiohttp import web_app


def forget_built_apps() -> None:
    """Empty aiohttp's middleware chain cache, so that applications no longer served can be collected.

    Raises ``AttributeError`` when aiohttp no longer has that cache: this helper (and the fixture that calls
    it after every test) is then to be reviewed, not silently skipped.
    """
    web_app._cached_build_middleware.cache_clear()
