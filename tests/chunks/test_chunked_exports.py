"""Chunked exports on the real servers (docs/chunks.md: Chunked exports): the file written from chunks by the real
relay, worker and janitor is the file one stream writes, byte for byte for every format (HTML's day sections running
across chunks, with a filter too), and after decompression with gzip; its digest describes the stored bytes; a chunk
under 5 MiB in the middle is assembled through the fallback; the chunks' objects are gone once the export has
succeeded.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY

from devtools.broker import delete_broker_objects
from devtools.moto import MotoServer
from services.worker.chunked.assembly import Checkpoint
from services.worker.operation.job import ExportJob
from shared.repository import export_reader, outbox
from shared.settings import Settings
from tests.support import claims, make_settings, wait_for
from tests.support.api_calls import make_conversation, running_pipeline, submit, succeeded, wait_terminal
from tests.support.bucket import objects_under
from tests.support.exported_files import assert_self_contained, parsed
from tests.support.exports import Auth, Client

pytestmark = pytest.mark.module_database

MIB = 1024 * 1024
# Small chunks, so that the test's files stay small: every one of them goes through the assembler's buffer.
SMALL = {"chunk_threshold_bytes": 100_000, "chunk_target_bytes": 60_000, "chunks_per_export": 3}


@pytest.fixture
async def settings(database_url: str, moto: MotoServer) -> AsyncIterator[Settings]:
    """The test's settings with a low chunking threshold."""
    test_settings = make_settings(database_url, moto.endpoint_url, **SMALL)
    yield test_settings
    await delete_broker_objects(test_settings)


async def fill(pool: asyncpg.Pool, cid: str, count: int, *, body_bytes: int = 300) -> None:
    """``count`` messages in ``cid`` from alice and bob, ten minutes apart (so that a day holds 144), bodies of
    up to about ``body_bytes`` bytes that differ 50-fold in size, with quotes, commas, line breaks, formula
    signs and non-ASCII text.
    """
    await pool.execute(
        "INSERT INTO conversations (conversation_id, last_seq) VALUES ($1, $2)"
        " ON CONFLICT (conversation_id) DO UPDATE SET last_seq = excluded.last_seq",
        cid,
        count,
    )
    await pool.execute(
        """
        INSERT INTO messages (conversation_id, seq, message_id, sender_id, body, sent_at)
        SELECT $1, n, 'm' || n, CASE WHEN n % 3 = 0 THEN 'bob' ELSE 'alice' END,
               CASE n % 4 WHEN 0 THEN '=' WHEN 1 THEN '"q", ' WHEN 2 THEN E'line\\nbreak ' ELSE 'é ' END
               || n || ' ' || repeat('x', (n * 7919 % 50 + 1) * $3 / 50),
               timestamptz '2026-01-01Z' + n * interval '10 minutes'
        FROM generate_series(1, $2) AS n
        """,
        cid,
        count,
        body_bytes,
    )


async def fill_hex(pool: asyncpg.Pool, cid: str, count: int, *, body_bytes: int) -> None:
    """``count`` messages from alice in the existing ``cid`` whose bodies are ``body_bytes`` of hex digits
    that repeat nothing: gzip makes them about half as big, no smaller.
    """
    await pool.execute("UPDATE conversations SET last_seq = $2 WHERE conversation_id = $1", cid, count)
    await pool.execute(
        """
        INSERT INTO messages (conversation_id, seq, message_id, sender_id, body, sent_at)
        SELECT $1, n, 'm' || n, 'alice',
               (SELECT string_agg(md5(n || '-' || i), '') FROM generate_series(1, $3 / 32) AS i),
               timestamptz '2026-01-01Z' + n * interval '1 minute'
        FROM generate_series(1, $2) AS n
        """,
        cid,
        count,
        body_bytes,
    )


async def export_file(api: Client, auth: Auth, cid: str, body: dict[str, Any], key: str) -> tuple[bytes, Any]:
    operation = await succeeded(api, auth, "alice", cid, body, key)
    response = await api.get(operation["result"]["url"], headers=auth("alice"))
    assert response.status == 200, await response.text()
    return await response.read(), operation


async def chunks_of(pool: asyncpg.Pool, operation_id: str) -> list[asyncpg.Record]:
    return await pool.fetch(
        "SELECT chunk_no, state, size_bytes FROM export_chunks WHERE operation_id = $1 ORDER BY chunk_no", operation_id
    )


async def chunked_and_streamed(
    api: Client, auth: Auth, settings: Settings, pool: asyncpg.Pool, cid: str, body: dict[str, Any], key: str
) -> tuple[bytes, bytes, dict[str, Any]]:
    """The file of ``body`` written in chunks, then by one stream (chunking off), and the chunked operation."""
    async with running_pipeline(settings):
        chunked, operation = await export_file(api, auth, cid, body, f"{key}-chunked")
    async with running_pipeline(settings.model_copy(update={"chunk_threshold_bytes": 0})):
        streamed, _ = await export_file(api, auth, cid, body, f"{key}-streamed")
    return chunked, streamed, operation


# Every format; HTML, whose day sections run across chunks, also with a filter and a start: a chunk goes on
# from the file's message before it, not the conversation's.
REQUESTS = [
    {"format": "jsonl"},
    {"format": "csv"},
    {"format": "txt"},
    {"format": "html"},
    {"format": "html", "senders": ["bob"], "after_seq": 100},
]


@pytest.mark.parametrize("request_body", REQUESTS, ids=lambda body: "-".join(map(str, body.values())))
async def test_a_chunked_file_is_the_streamed_file_byte_for_byte(
    api: Client, auth: Auth, settings: Settings, pool: asyncpg.Pool, s3: Any, request_body: dict[str, Any]
) -> None:
    await make_conversation(api, auth, "c-a", ["alice", "bob"])
    await fill(pool, "c-a", 2000)
    chunked, streamed, operation = await chunked_and_streamed(api, auth, settings, pool, "c-a", request_body, "key")
    assert chunked == streamed
    result = operation["result"]
    assert result["size_bytes"] == len(chunked)
    assert result["sha256"] == hashlib.sha256(chunked).hexdigest()
    # bob sent every third message (fill).
    assert result["message_count"] == (2000 if len(request_body) == 1 else len(range(102, 2001, 3)))
    planned = await chunks_of(pool, operation["operation_id"])
    # The plan weighs what the export writes: bob's filter leaves about a third of the chunks.
    assert len(planned) > (5 if len(request_body) == 1 else 2) and {chunk["state"] for chunk in planned} == {"DONE"}
    # Operators see the chunks in the admin view.
    admin = await api.get(f"/admin/operations/{operation['operation_id']}", headers=auth("root", admin=True))
    shown = (await admin.json())["chunks"]
    assert [(chunk["chunk_no"], chunk["state"], chunk["worker"]) for chunk in shown] == [
        (chunk["chunk_no"], "DONE", None) for chunk in planned
    ]
    assert sum(chunk["size_bytes"] for chunk in shown) == len(chunked)
    # The chunks' objects are removed once the file is published; only the file stays.
    await wait_for(lambda: _only_the_file(s3, settings, operation["operation_id"]))


async def _only_the_file(s3: Any, settings: Settings, operation_id: str) -> bool:
    return not any("/chunks/" in key for key in await objects_under(s3, settings, operation_id))


async def test_a_chunked_gzip_file_holds_the_streamed_bytes_in_several_members(
    api: Client, auth: Auth, settings: Settings, pool: asyncpg.Pool
) -> None:
    await make_conversation(api, auth, "c-a", ["alice", "bob"])
    await fill(pool, "c-a", 2000)
    chunked, streamed, operation = await chunked_and_streamed(
        api, auth, settings, pool, "c-a", {"format": "csv", "compression": "gzip"}, "gz"
    )
    assert gzip.decompress(chunked) == gzip.decompress(streamed)
    assert operation["result"]["sha256"] == hashlib.sha256(chunked).hexdigest()
    assert chunked.count(b"\x1f\x8b\x08") >= len(await chunks_of(pool, operation["operation_id"]))


async def test_a_filter_leaves_small_chunks_between_copied_ones(
    api: Client, auth: Auth, settings: Settings, pool: asyncpg.Pool
) -> None:
    # Chunks of about 6 MiB, copied by S3; bob's messages alone leave each a third of that, which the
    # assembler must read through itself.
    big = settings.model_copy(update={"chunk_threshold_bytes": 10 * MIB, "chunk_target_bytes": 6 * MIB})
    await make_conversation(api, auth, "c-a", ["alice", "bob"])
    await fill(pool, "c-a", 1300, body_bytes=30_000)
    async with running_pipeline(big):
        everything, operation = await export_file(api, auth, "c-a", {}, "all")
        only_bob, bob_operation = await export_file(api, auth, "c-a", {"senders": ["bob"]}, "bob")
    async with running_pipeline(settings.model_copy(update={"chunk_threshold_bytes": 0})):
        streamed, _ = await export_file(api, auth, "c-a", {}, "all-streamed")
        bob_streamed, _ = await export_file(api, auth, "c-a", {"senders": ["bob"]}, "bob-streamed")
    assert everything == streamed and only_bob == bob_streamed
    sizes = [chunk["size_bytes"] for chunk in await chunks_of(pool, operation["operation_id"])]
    assert len(sizes) >= 3 and max(sizes) >= 5 * MIB
    bob_sizes = [chunk["size_bytes"] for chunk in await chunks_of(pool, bob_operation["operation_id"])]
    assert all(size < 5 * MIB for size in bob_sizes[:-1])


async def test_a_full_size_gzip_export_is_copied_by_s3_in_parts_of_at_least_5_mib(
    api: Client, auth: Auth, settings: Settings, pool: asyncpg.Pool
) -> None:
    big = settings.model_copy(update={"chunk_threshold_bytes": 10 * MIB, "chunk_target_bytes": 12 * MIB})
    await make_conversation(api, auth, "c-a", ["alice", "bob"])
    await fill_hex(pool, "c-a", 2600, body_bytes=10_000)
    body = {"format": "jsonl", "compression": "gzip"}
    async with running_pipeline(big):
        chunked, operation = await export_file(api, auth, "c-a", body, "gz-full")
    async with running_pipeline(settings.model_copy(update={"chunk_threshold_bytes": 0})):
        streamed, _ = await export_file(api, auth, "c-a", body, "gz-full-streamed")
    assert gzip.decompress(chunked) == gzip.decompress(streamed)
    assert operation["result"]["sha256"] == hashlib.sha256(chunked).hexdigest()
    sizes = [chunk["size_bytes"] for chunk in await chunks_of(pool, operation["operation_id"])]
    assert len(sizes) >= 2 and all(size >= 5 * MIB for size in sizes[:-1]), sizes


async def parts_of(api: Client, auth: Auth, operation: dict[str, Any]) -> list[bytes]:
    """The parts of a split result, downloaded, each checked against its figures."""
    contents = []
    for part in operation["result"]["parts"]:
        response = await api.get(part["url"], headers=auth("alice"))
        assert response.status == 200, await response.text()
        content = await response.read()
        assert len(content) == part["size_bytes"] and hashlib.sha256(content).hexdigest() == part["sha256"]
        contents.append(content)
    return contents


async def done_chunks(pool: asyncpg.Pool, operation_id: str) -> list[asyncpg.Record]:
    return await pool.fetch(
        "SELECT after_seq, last_seq, message_count, first_message_seq, last_message_seq FROM export_chunks"
        " WHERE operation_id = $1 AND state = 'DONE' ORDER BY after_seq",
        operation_id,
    )


async def test_a_split_result_is_made_of_whole_chunks(
    api: Client, auth: Auth, settings: Settings, pool: asyncpg.Pool, s3: Any
) -> None:
    await make_conversation(api, auth, "c-a", ["alice", "bob"])
    await fill(pool, "c-a", 2000)
    async with running_pipeline(settings):
        operation = await succeeded(api, auth, "alice", "c-a", {"max_part_bytes": 5 * MIB}, "split")
    async with running_pipeline(settings.model_copy(update={"chunk_threshold_bytes": 0})):
        whole, _ = await export_file(api, auth, "c-a", {}, "whole")
    parts = operation["result"]["parts"]
    chunks = await done_chunks(pool, operation["operation_id"])
    # Each part is one chunk, whole: the same messages, the same seqs.
    assert len(parts) == len(chunks) > 5
    assert [(part["first_seq"], part["last_seq"], part["message_count"]) for part in parts] == [
        (chunk["first_message_seq"], chunk["last_message_seq"], chunk["message_count"]) for chunk in chunks
    ]
    assert parts[0]["first_seq"] == 1 and parts[-1]["last_seq"] == 2000
    assert b"".join(await parts_of(api, auth, operation)) == whole
    await wait_for(lambda: _only_the_file(s3, settings, operation["operation_id"]))


async def test_a_chunk_whose_part_is_full_hands_the_rest_of_its_range_to_a_new_chunk(
    api: Client, auth: Auth, settings: Settings, pool: asyncpg.Pool
) -> None:
    # The plan estimates JSONL lines: 3,000 bodies of 1,000 '<' are about 3 MB, a few chunks; as HTML each
    # '<' is '&lt;', so a chunk's rendering outgrows the 5 MiB part and ends early.
    await make_conversation(api, auth, "c-a", ["alice", "bob"])
    await pool.execute("UPDATE conversations SET last_seq = 3000 WHERE conversation_id = 'c-a'")
    await pool.execute(
        "INSERT INTO messages (conversation_id, seq, message_id, sender_id, body, sent_at)"
        " SELECT 'c-a', n, 'm' || n, 'alice', n || repeat('<', 1000),"
        "        timestamptz '2026-01-01Z' + n * interval '1 minute'"
        " FROM generate_series(1, 3000) AS n"
    )
    html = settings.model_copy(update={"chunk_target_bytes": 2 * MIB})
    async with running_pipeline(html):
        operation = await succeeded(api, auth, "alice", "c-a", {"format": "html", "max_part_bytes": 5 * MIB}, "html")
    parts = operation["result"]["parts"]
    chunks = await done_chunks(pool, operation["operation_id"])
    async with pool.acquire() as conn:
        plan = await export_reader.plan_ranges(
            conn, conversation_id="c-a", after_seq=0, last_seq=3000, target_bytes=html.chunk_target_bytes
        )
    assert len(parts) == len(chunks) > len(plan) >= 2
    assert all(earlier["last_seq"] == later["after_seq"] for earlier, later in itertools.pairwise(chunks))
    bodies: list[str] = []
    for content in await parts_of(api, auth, operation):
        text = content.decode()
        assert len(content) <= 5 * MIB and text.startswith("<!DOCTYPE html>") and text.endswith("</html>\n")
        transcript = parsed(content)
        assert_self_contained(transcript)
        bodies += transcript.bodies
    assert bodies == [f"{n}{'<' * 1000}" for n in range(1, 3001)]


async def test_chunks_are_planned_on_the_messages_the_export_writes_not_the_recalled_ones(
    api: Client, auth: Auth, settings: Settings, pool: asyncpg.Pool
) -> None:
    """docs/chunks.md: The plan. With the middle 90 % of a conversation recalled, weighing every message
    planned mostly empty chunks; each chunk now holds some of the messages the file has.
    """
    small = settings.model_copy(update={"chunk_threshold_bytes": 100_000, "chunk_target_bytes": 30_000})
    await make_conversation(api, auth, "c-a", ["alice", "bob"])
    await fill(pool, "c-a", 2000, body_bytes=3000)
    await pool.execute(
        "UPDATE messages SET recalled_at = now() WHERE conversation_id = 'c-a' AND seq BETWEEN 101 AND 1900"
    )
    written = await pool.fetchval(
        "SELECT sum(octet_length(body) + $1) FROM messages WHERE conversation_id = 'c-a' AND recalled_at IS NULL",
        export_reader.LINE_OVERHEAD_BYTES,
    )
    chunked, streamed, operation = await chunked_and_streamed(api, auth, small, pool, "c-a", {}, "recalled")
    assert chunked == streamed and operation["result"]["message_count"] == 200
    chunks = await done_chunks(pool, operation["operation_id"])
    assert len(chunks) >= 2 and all(chunk["message_count"] > 0 for chunk in chunks)
    # About one chunk per target's worth of what is written (a chunk ends past its target by one message).
    assert len(chunks) <= written // small.chunk_target_bytes + 1


async def test_a_coordinator_that_takes_over_resumes_the_assembly_from_its_last_checkpoint(
    api: Client, auth: Auth, settings: Settings, pool: asyncpg.Pool, s3: Any
) -> None:
    """docs/chunks.md: A coordinator's takeover. Generation 1's coordinator is lost (its process gone: nothing of
    it cleans up) once it has recorded a checkpoint; the coordinator that takes over reads only what follows.
    """
    one_at_a_time = settings.model_copy(
        update={"chunk_threshold_bytes": 4 * MIB, "chunk_target_bytes": 2 * MIB, "chunks_per_export": 1}
    )
    await make_conversation(api, auth, "c-a", ["alice", "bob"])
    await fill(pool, "c-a", 1000, body_bytes=30_000)
    response = await submit(api, auth, "alice", "c-a", {}, "taken-over")
    assert response.status == 202, await response.text()
    operation_id = (await response.json())["operation_id"]
    async with pool.acquire() as conn:
        first = await claims.claim(conn, operation_id, "w-lost", lease_seconds=one_at_a_time.lease_seconds)
    checkpoint_sql = "SELECT assembly::text FROM artifacts WHERE operation_id = $1 AND generation = 1"

    async with running_pipeline(one_at_a_time):
        lost = ExportJob(pool=pool, s3=s3, settings=one_at_a_time, claimed=first)

        async def gone(generation: int) -> None:
            """A killed process removes nothing."""

        lost.discard = gone  # type: ignore[method-assign]
        writing = asyncio.create_task(lost.write())
        await wait_for(lambda: pool.fetchval(checkpoint_sql, operation_id), timeout=60)
        writing.cancel()
        await asyncio.gather(writing, return_exceptions=True)
        checkpoint = Checkpoint.from_json(await pool.fetchval(checkpoint_sql, operation_id))
        assert checkpoint is not None
        read_before = REGISTRY.get_sample_value("chatexport_worker_assembly_bytes_read_total") or 0.0
        resumed_before = REGISTRY.get_sample_value("chatexport_worker_assemblies_resumed_total") or 0.0
        # Its lease runs out; a wake-up brings the pipeline's worker, which takes over.
        await pool.execute("UPDATE operations SET lease_expires_at = now() - interval '1 second'")
        async with pool.acquire() as conn:
            await outbox.enqueue_run(conn, operation_id=operation_id)
        operation = await wait_terminal(api, auth, "alice", f"/v3/operations/{operation_id}", timeout=120)
    assert operation["state"] == "SUCCEEDED", operation
    content = await api.get(operation["result"]["url"], headers=auth("alice"))
    taken_over = await content.read()
    async with running_pipeline(settings.model_copy(update={"chunk_threshold_bytes": 0})):
        streamed, _ = await export_file(api, auth, "c-a", {}, "streamed")
    assert taken_over == streamed
    assert operation["result"]["sha256"] == hashlib.sha256(streamed).hexdigest()
    assert REGISTRY.get_sample_value("chatexport_worker_assemblies_resumed_total") == resumed_before + 1
    read_again = (REGISTRY.get_sample_value("chatexport_worker_assembly_bytes_read_total") or 0.0) - read_before
    assert checkpoint.size_bytes > 0 and read_again == len(streamed) - checkpoint.size_bytes
    states = await pool.fetch(
        "SELECT generation, state FROM artifacts WHERE operation_id = $1 ORDER BY generation", operation_id
    )
    assert [tuple(row) for row in states] == [(1, "PUBLISHED"), (2, "DELETED")]


async def test_a_filtered_split_result_is_planned_on_the_messages_it_writes(
    api: Client, auth: Auth, settings: Settings, pool: asyncpg.Pool
) -> None:
    """docs/chunks.md: The plan; docs/chunks.md: Split results. Bob's third of the messages is weighed alone:
    each part holds about a chunk's worth of his messages, not a third of one.
    """
    await make_conversation(api, auth, "c-a", ["alice", "bob"])
    await fill(pool, "c-a", 3000, body_bytes=3000)
    body = {"senders": ["bob"], "max_part_bytes": 5 * MIB}
    written = await pool.fetchval(
        "SELECT sum(octet_length(body) + $1) FROM messages WHERE conversation_id = 'c-a' AND sender_id = 'bob'",
        export_reader.LINE_OVERHEAD_BYTES,
    )
    async with running_pipeline(settings):
        operation = await succeeded(api, auth, "alice", "c-a", body, "bob-split")
    chunks = await done_chunks(pool, operation["operation_id"])
    parts = operation["result"]["parts"]
    assert 2 <= len(parts) == len(chunks) <= written // settings.chunk_target_bytes + 1
    lines = [line for part in await parts_of(api, auth, operation) for line in part.splitlines()]
    bob = await pool.fetch("SELECT seq FROM messages WHERE conversation_id = 'c-a' AND sender_id = 'bob' ORDER BY seq")
    assert [json.loads(line)["seq"] for line in lines] == [row["seq"] for row in bob]
