"""The baseline of the HTTP benchmarks: a bare aiohttp + asyncpg server on the product's database, doing only
the database work of a poll (one primary-key read) and of a submit (the same three inserts in one
transaction), with no authentication, validation, idempotency check, quota or representation.

    .venv/bin/python -m bench.bare_server --database-url URL --port PORT
"""

from __future__ import annotations

import argparse
import json
import uuid
from typing import Any

import asyncpg
from aiohttp import web

from bench.bare_pipeline import no_reset

POOL = web.AppKey("pool", asyncpg.Pool)


async def poll(request: web.Request) -> web.Response:
    """``GET /ops/{id}``: the operation's row as JSON."""
    row = await request.app[POOL].fetchrow(
        "SELECT * FROM operations WHERE operation_id = $1", request.match_info["operation_id"]
    )
    if row is None:
        raise web.HTTPNotFound()
    return web.json_response({name: _plain(value) for name, value in row.items()})


async def submit(request: web.Request) -> web.Response:
    """``POST /submit/{cid}``: an operation, its idempotency record and its outbox row in one transaction."""
    body = await request.json()
    operation_id = f"op_{uuid.uuid4().hex}"
    owner = request.headers.get("X-User", "bench")
    async with request.app[POOL].acquire() as conn, conn.transaction():
        await conn.execute(
            "INSERT INTO operations (operation_id, owner_id, conversation_id, format, state)"
            " VALUES ($1, $2, $3, $4, 'QUEUED')",
            operation_id,
            owner,
            request.match_info["cid"],
            body.get("format", "jsonl"),
        )
        await conn.execute(
            "INSERT INTO idempotency_keys (owner_id, idempotency_key, fingerprint, operation_id)"
            " VALUES ($1, $2, $3, $4)",
            owner,
            request.headers["Idempotency-Key"],
            "0" * 64,
            operation_id,
        )
        await conn.execute(
            "INSERT INTO outbox (operation_id, routing_key, payload) VALUES ($1, 'export.run', $2::jsonb)",
            operation_id,
            json.dumps({"operation_id": operation_id}),
        )
    return web.json_response({"operation_id": operation_id}, status=202)


def _plain(value: Any) -> Any:
    return value if value is None or isinstance(value, (int, float, str, bool)) else str(value)


async def _pool(app: web.Application, database_url: str) -> Any:
    # As lean as the product's pool: no reset round trip on release (``shared.db.create_pool``).
    app[POOL] = await asyncpg.create_pool(database_url, min_size=4, max_size=10, reset=no_reset)
    yield
    await app[POOL].close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    app = web.Application()
    app.cleanup_ctx.append(lambda app: _pool(app, args.database_url))
    app.router.add_get("/ops/{operation_id}", poll)
    app.router.add_post("/submit/{cid}", submit)
    web.run_app(app, host="127.0.0.1", port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
