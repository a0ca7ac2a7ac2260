"""The S3 emulator's process: moto's WSGI application, with the one fix that makes its answers those of S3,
served over connections kept alive as S3 keeps them (docs/development.md: Development, The S3 emulator).
``devtools.moto`` starts it as ``python -m devtools.s3_emulator -H HOST -p PORT [--server NAME]``, as moto's
own ``moto_server``; port 0 picks a free one. Its one line on stdout, once it listens, is the port it bound.

The server is cheroot's: HTTP/1.1 with keep-alive, so a client's connection pool works as it does against S3.
moto's own server (werkzeug's, ``--server werkzeug``, for benchmarks of before) answers every request with
``Connection: close``, so each request paid for a new TCP connection, which S3 never makes a client do.
waitress keeps connections alive too, but drops every request header whose name holds ``_`` before the
application sees it; cheroot keeps them and only folds ``_`` with ``-`` in the WSGI environ, as every WSGI
server must, so the gateway below hands moto the names as sent, as moto's own request handler does.

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

from cheroot import wsgi
from moto.core.request import (
    PRESERVED_HEADER_NAMES_ENVIRON_KEY,
    environ_key_for_header,
    should_preserve_original_header_name,
)
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from moto.s3.models import FakeKey
from werkzeug.serving import make_server

from devtools.moto import SERVERS

# Idle kept-alive connections are closed after this many seconds: longer than aiobotocore keeps an idle one
# (12 s), so the client closes first, as it does against S3, and never sends on a connection being closed.
_IDLE_SECONDS = 60
# Requests served at once; an idle kept-alive connection holds no thread.
_THREADS = 32
# Idle kept-alive connections held at once: no limit, as S3 has none a client meets. cheroot's default (10)
# answers `Connection: close` once ten are idle, so a system whose workers, api and janitor pool more than
# ten between them opened a new connection for about one PutObject in six of a drain.
_IDLE_CONNECTIONS: int | None = None

_unlocked_etag: property = FakeKey.etag  # type: ignore[assignment]


def _etag_under_lock(key: Any) -> str:
    with key.lock:
        etag: str = _unlocked_etag.fget(key)  # type: ignore[misc]
    return etag


def serialise_etags() -> None:
    """Compute each object's ETag under the lock of its other readers (moto 5.2's ``FakeKey.value``)."""
    FakeKey.etag = property(_etag_under_lock)  # type: ignore[method-assign,assignment]


class _NamesAsSent(wsgi.Gateway_10):
    """cheroot's WSGI gateway, which also tells moto the names of the metadata headers as they were sent
    (``x-amz-meta-my_key`` is not ``x-amz-meta-my-key`` to S3), as moto's ``MotoRequestHandler`` does."""

    def get_environ(self) -> dict[str, Any]:  # type: ignore[override] # cheroot's stub says None
        environ: dict[str, Any] = super().get_environ()
        names: dict[str, str] = {}
        dashed: set[str] = set()
        for raw, value in self.req.inheaders.items():
            name = raw.decode("latin-1")
            if "_" not in name:
                # As moto's handler: an underscored name never stands in for a dashed one sent beside it.
                key = environ_key_for_header(name)
                dashed.add(key)
                if key.startswith("HTTP_"):
                    environ[key] = value.decode("latin-1")
            elif should_preserve_original_header_name(name):
                names.setdefault(environ_key_for_header(name), name.lower())
        environ[PRESERVED_HEADER_NAMES_ENVIRON_KEY] = {key: name for key, name in names.items() if key not in dashed}
        return environ


class _KeptAliveServer(wsgi.Server):
    """cheroot's WSGI server with the gateway above."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gateway = _NamesAsSent
        self.keep_alive_conn_limit = _IDLE_CONNECTIONS  # type: ignore[assignment] # cheroot reads None as no limit


def serve(host: str, port: int, server_name: str = SERVERS[0]) -> None:
    """Serve moto's S3 on ``host:port`` (0: a free port) with ``server_name`` (one of ``SERVERS``) until SIGTERM
    or SIGINT, as ``moto_server`` does, and write the bound port as one line on stdout once it listens.
    """
    app = DomainDispatcherApplication(create_backend_app)
    app.debug = True  # type: ignore[attr-defined] # as moto_server: an error's traceback in the answer
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _signum, _frame: sys.exit(0))
    if server_name == "werkzeug":
        old = make_server(host, port, app, threaded=True, request_handler=MotoRequestHandler)
        _listening(old.port)
        old.serve_forever()
        return
    server = _KeptAliveServer((host, port), app, numthreads=_THREADS, timeout=_IDLE_SECONDS)
    server.prepare()
    _listening(server.bind_addr[1])
    try:
        server.serve()
    finally:
        server.stop()


def _listening(port: int) -> None:
    os.environ["MOTO_PORT"] = str(port)  # moto names its own endpoint with it, as moto_server sets it
    print(port, flush=True)
    # Nothing else goes to stdout: whoever started us may stop reading it.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, default=0)
    parser.add_argument("--server", choices=SERVERS, default=SERVERS[0])
    arguments = parser.parse_args()
    serialise_etags()
    serve(arguments.host, arguments.port, arguments.server)
