"""The S3 emulator's process: moto's server mode, with the one fix that makes its answers those of S3
(docs/development.md: Development, The S3 emulator). ``devtools.moto`` starts it as
``python -m devtools.s3_emulator -H HOST -p PORT``, as moto's own ``moto_server``; port 0 picks a free one.
Its one line on stdout, once it listens, is the port it bound.

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

import argparse
import os
import signal
import sys
from typing import Any

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from moto.s3.models import FakeKey
from werkzeug.serving import make_server

_unlocked_etag: property = FakeKey.etag  # type: ignore[assignment]


def _etag_under_lock(key: Any) -> str:
    with key.lock:
        etag: str = _unlocked_etag.fget(key)  # type: ignore[misc]
    return etag


def serialise_etags() -> None:
    """Compute each object's ETag under the lock of its other readers (moto 5.2's ``FakeKey.value``)."""
    FakeKey.etag = property(_etag_under_lock)  # type: ignore[method-assign,assignment]


def serve(host: str, port: int) -> None:
    """Serve moto's S3 on ``host:port`` (0: a free port) until SIGTERM or SIGINT, as ``moto_server`` does, and
    write the bound port as one line on stdout once it listens.
    """
    app = DomainDispatcherApplication(create_backend_app)
    app.debug = True  # type: ignore[attr-defined] # as moto_server: an error's traceback in the answer
    server = make_server(host, port, app, threaded=True, request_handler=MotoRequestHandler)
    os.environ["MOTO_PORT"] = str(server.port)  # moto names its own endpoint with it, as moto_server sets it
    print(server.port, flush=True)
    # Nothing else goes to stdout: whoever started us may stop reading it.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _signum, _frame: sys.exit(0))
    server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, default=0)
    arguments = parser.parse_args()
    serialise_etags()
    serve(arguments.host, arguments.port)
