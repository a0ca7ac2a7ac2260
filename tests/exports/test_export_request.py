"""The export request on its way into Postgres (docs/api.md: Submitting an export, Submit; Rolling deploys): one list of
fields, each stored in its column by ``submit_export_v2``; the outcomes Postgres can answer; and the submit
of the previous release, which still works beside the new one.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import asyncpg
import pytest

from services.api.http.schemas import ExportSubmission, OperationRequest
from shared.broker import EXPORT_ROUTING_KEY
from shared.export.fingerprint import fingerprint
from shared.export.request import FIELDS, SHOWN_FIELDS, ExportRequest
from shared.repository import status_monitor
from shared.repository.operation_view import REPRESENTATION_VIEW, OperationView
from shared.repository.submissions import SubmitOutcome, SubmitResult, submit_export
from tests.support import cloned_database
from tests.support.api_calls import make_conversation
from tests.support.exports import Auth, Client

pytestmark = pytest.mark.module_database

# Every field away from its default, so that a field the submit leaves out reads back as its default and fails.
EVERY_OPTION = ExportRequest(
    format="csv",
    before_seq=90,
    after_seq=3,
    notify_url="https://example.com/hook",
    since=datetime(2026, 3, 1, 12, 30, 0, 1000, tzinfo=UTC),
    until=datetime(2026, 3, 2, tzinfo=UTC),
    senders=("alice", "bob"),
    compression="gzip",
    max_part_bytes=6 * 1024 * 1024,
)


@pytest.fixture
async def member(api: Client, auth: Auth) -> None:
    """``c-a`` with alice."""
    await make_conversation(api, auth, "c-a", ["alice"])


async def submit(conn: asyncpg.Connection, operation_id: str, key: str, request: ExportRequest) -> SubmitResult:
    """Alice's submit of ``request`` for ``c-a`` under ``key``, with room for many active exports."""
    return await submit_export(
        conn,
        operation_id=operation_id,
        owner_id="alice",
        conversation_id="c-a",
        idempotency_key=key,
        fingerprint=fingerprint(user_id="alice", conversation_id="c-a", request=request),
        request=request,
        replay_window_seconds=3600,
        max_active=100,
        limits=None,
    )


async def test_the_submission_the_request_and_the_stored_columns_name_the_same_fields(pool: asyncpg.Pool) -> None:
    # The body's notify object carries the request's notify_url.
    submitted = {"notify_url" if name == "notify" else name for name in ExportSubmission.model_fields}
    columns = {
        row["column_name"]
        for row in await pool.fetch(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'operations'"
        )
    }
    assert submitted == set(FIELDS)
    assert set(FIELDS) <= columns, set(FIELDS) - columns
    # What the operation shows of the request: everything but the callback's URL.
    assert set(OperationRequest.model_fields) == set(SHOWN_FIELDS)


async def test_every_field_is_stored_in_its_column(pool: asyncpg.Pool, member: None) -> None:
    async with pool.acquire() as conn:
        result = await submit(conn, "op-every", "k-1", EVERY_OPTION)
        row = await conn.fetchrow("SELECT * FROM operations WHERE operation_id = 'op-every'")
        shown = await status_monitor.read_operation(conn, operation_id="op-every", owner_id="alice")
    # The operation is answered as the status monitor shows it after the submit's writes.
    assert result == SubmitResult(SubmitOutcome.CREATED, "op-every", aged_as(shown, result))
    assert ExportRequest.from_row(row) == EVERY_OPTION
    assert (row["owner_id"], row["conversation_id"], row["state"]) == ("alice", "c-a", "QUEUED")


async def test_a_default_request_stores_the_columns_defaults(pool: asyncpg.Pool, member: None) -> None:
    async with pool.acquire() as conn:
        await submit(conn, "op-default", "k-1", ExportRequest())
        row = await conn.fetchrow("SELECT * FROM operations WHERE operation_id = 'op-default'")
    assert ExportRequest.from_row(row) == ExportRequest()


async def test_postgres_answers_exactly_the_outcomes_of_the_enum(pool: asyncpg.Pool) -> None:
    outcomes = await pool.fetchval("SELECT enum_range(NULL::submit_outcome)::text[]")
    assert outcomes == [outcome.value for outcome in SubmitOutcome]


async def test_an_api_of_the_previous_release_still_submits_and_the_new_one_replays_its_key(
    pool: asyncpg.Pool, member: None
) -> None:
    # The call of the previous release's repository, as it is in its code: 18 positional arguments.
    request = EVERY_OPTION
    digest = fingerprint(user_id="alice", conversation_id="c-a", request=request)
    async with pool.acquire() as conn:
        old = await conn.fetchrow(
            "SELECT * FROM submit_export($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,"
            " $18)",
            "op-old",
            "alice",
            "c-a",
            "k-1",
            digest,
            3600.0,
            100,
            ["QUEUED", "RUNNING", "RETRY_AT", "CANCEL_REQUESTED"],
            EXPORT_ROUTING_KEY,
            request.format,
            request.before_seq,
            request.after_seq,
            request.notify_url,
            request.since,
            request.until,
            list(request.senders or ()),
            request.compression,
            request.max_part_bytes,
        )
        row = await conn.fetchrow("SELECT * FROM operations WHERE operation_id = 'op-old'")
        replay = await submit(conn, "op-new", "k-1", request)
        shown = await status_monitor.read_operation(conn, operation_id="op-old", owner_id="alice")
    assert (old["outcome"], old["operation_id"]) == ("created", "op-old")
    assert ExportRequest.from_row(row) == request
    assert replay == SubmitResult(SubmitOutcome.REPLAYED, "op-old", aged_as(shown, replay))


def aged_as(shown: OperationView | None, result: SubmitResult) -> OperationView:
    """``shown`` with the age ``result``'s operation had when the submit read it: the one column of the view
    that moves with the clock.
    """
    assert shown is not None and result.accepted is not None
    return dataclasses.replace(shown, age_seconds=result.accepted.age_seconds)


async def add_a_column_to_the_view(conn: asyncpg.Connection) -> None:
    """Add a column at the end of the representation's view, as a later release's pre migration may."""
    definition = await conn.fetchval("SELECT pg_get_viewdef($1::regclass)", REPRESENTATION_VIEW)
    head, _, tail = definition.rstrip().rstrip(";").rpartition("FROM ")
    await conn.execute(f"CREATE OR REPLACE VIEW {REPRESENTATION_VIEW} AS {head}, 1 AS added_later FROM {tail}")


async def test_a_column_added_to_the_view_while_apis_run_leaves_their_submits_working(template_db: str) -> None:
    # A rolling deploy migrates while the previous release still submits (docs/deploy.md: Rolling deploys). A
    # database of its own: the view it changes outlives the test.
    async with cloned_database(template_db, "chatexport_t") as url:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("INSERT INTO conversations (conversation_id) VALUES ('c-a')")
            await conn.execute("INSERT INTO conversation_members (conversation_id, user_id) VALUES ('c-a', 'alice')")
            assert (await submit(conn, "op-1", "k-1", ExportRequest())).accepted is not None  # its statement cached
            await add_a_column_to_the_view(conn)
            again = await submit(conn, "op-2", "k-2", ExportRequest())
        finally:
            await conn.close()
    assert again.outcome is SubmitOutcome.CREATED and again.accepted is not None
    assert again.accepted.operation_id == "op-2"


async def test_a_column_added_to_the_view_leaves_reads_in_a_transaction_working(template_db: str) -> None:
    # asyncpg prepares a statement again after its result changed shape only outside a transaction; a read
    # that named `*` would fail here (docs/deploy.md: Upgrading, What each mix of releases may do).
    async with cloned_database(template_db, "chatexport_t") as url:
        conn = await asyncpg.connect(url)
        other = await asyncpg.connect(url)
        try:
            await conn.execute("INSERT INTO conversations (conversation_id) VALUES ('c-a')")
            await conn.execute("INSERT INTO conversation_members (conversation_id, user_id) VALUES ('c-a', 'alice')")
            await submit(conn, "op-1", "k-1", ExportRequest())
            async with conn.transaction():
                assert await status_monitor.read_operation(conn, operation_id="op-1", owner_id="alice") is not None
                listed = await status_monitor.read_operations(conn, owner_id="alice", state=None, limit=5, after=None)
                assert [row.operation_id for row in listed] == ["op-1"]
            await add_a_column_to_the_view(other)
            async with conn.transaction():
                again = await status_monitor.read_operation(conn, operation_id="op-1", owner_id="alice")
                listed = await status_monitor.read_operations(conn, owner_id="alice", state=None, limit=5, after=None)
        finally:
            await conn.close()
            await other.close()
    assert again is not None and again.operation_id == "op-1"
    assert [row.operation_id for row in listed] == ["op-1"]
