"""The S3 emulator's process: moto's server mode, with the one fix that makes its answers those of S3
(docs/development.md: Development, The S3 emulator). ``devtools.moto`` starts it as
``python -m devtools.s3_emulator -H HOST -p PORT``, taking moto's own arguments.

moto computes an object's ETag lazily, on the first request that shows it, by seeking to the start of the
object's buffer and reading it through, outside the lock its other readers take. A ListObjectsV2 (the
janitor's orphan sweep lists the whole prefix) or a HEAD that shows the ETag of an object while its PutObject
computes the same ETag for its own answer interleaves the two readers' seeks on one file: both hash a
scramble of the object, and the first to finish caches it. Objects that the buffer spills to disk (tens of
MiB and more, so the large exports) then answer their PutObject with an ETag that is not the MD5 of what was
sent, and the writer refuses the object (``StoredBytesDiffer``). S3 computes an ETag once, as it stores the
object; computing it under the object's own lock gives the same answer.
"""

from __future__ import annotations

import sys
from typing import Any

from moto.s3.models import FakeKey
from moto.server import main

_unlocked_etag: property = FakeKey.etag  # type: ignore[assignment]


def _etag_under_lock(key: Any) -> str:
    with key.lock:
        etag: str = _unlocked_etag.fget(key)  # type: ignore[misc]
    return etag


def serialise_etags() -> None:
    """Compute each object's ETag under the lock of its other readers (moto 5.2's ``FakeKey.value``)."""
    FakeKey.etag = property(_etag_under_lock)  # type: ignore[method-assign,assignment]


if __name__ == "__main__":
    serialise_etags()
    main(sys.argv[1:])
