"""The fault harness's invariant checker (docs/development.md: Development, The fault harness): once a round's faults
are repaired, it reads Postgres, S3 (moto directly, not through the proxy) and RabbitMQ, and returns every
violation it finds as a sentence. An empty list is a passed round.

Each check waits, up to its own deadline, for the system to become quiet (operations ended, the outbox
published, the queue drained, callbacks delivered, the janitor's clean-up done) before it judges.
"""

from __future__ import annotations

import asyncio
import csv
import gzip
import hashlib
import io
import itertools
import json
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

from devtools.servers import ServerError
from shared.export.cadence import Cadence
from shared.export.formats import FileKind
from shared.storage import artifact_prefix, is_folder, part_key
from tests.chaos.plan import PARTS
from tests.chaos.system import ChaosSystem
from tests.chaos.workload import TERMINAL, Observations
from tests.support.chains import RUNS_SQL, SELECTED_SQL, chain_findings

POLL_SECONDS = 0.1
# What a part that died of an uncaught error leaves in its log (the interpreter's report on stderr), and the
# last line of such a report: the error itself.
CRASH_STARTS = ("Traceback (most recent call last):", "  + Exception Group Traceback (most recent call last):")
ERROR_LINE = re.compile(r"^[\s|]*([\w.]+(?:Error|Exception)\w*: .*)$")
HTML_MESSAGE = re.compile(rb'<article id="m(\d+)"')

# A message as the checker compares it before and after a round: everything but the recall mark.
MESSAGES_SQL = """
SELECT conversation_id, message_id, md5(row(seq, sender_id, body, sent_at)::text) AS digest,
       recalled_at IS NOT NULL AS recalled
FROM messages
"""
# Messages of the operation's range that were stored a second before its submit, yet above its watermark:
# the watermark is fixed at the first claim, after the submit (docs/api.md: Submitting an export, The file).
BELOW_WATERMARK_SQL = """
SELECT count(*) FROM operations o JOIN messages m ON m.conversation_id = o.conversation_id
WHERE o.operation_id = $1 AND m.seq > o.after_seq AND (o.before_seq IS NULL OR m.seq < o.before_seq)
  AND m.sent_at <= o.created_at - interval '1 second' AND m.seq > o.snapshot_max_seq
"""
# The operations of a round: those a caller was told about, those of the round's keys (a run: its schedule's
# key), and any other created since the round began (which should not exist).
ROUND_OPERATIONS_SQL = """
SELECT o.*, coalesce(k.idempotency_key, s.idempotency_key) AS idempotency_key FROM operations o
LEFT JOIN idempotency_keys k ON k.operation_id = o.operation_id
LEFT JOIN idempotency_keys s ON s.schedule_id = o.schedule_id
WHERE o.operation_id = ANY($1) OR k.idempotency_key LIKE $2 || '%' OR s.idempotency_key LIKE $2 || '%'
   OR o.created_at >= $3
"""
# A schedule's due times with more than one run: the unique constraint must refuse the second
# (docs/schedules.md: Runs).
TWICE_DUE_SQL = """
SELECT due_at, array_agg(operation_id) AS runs FROM operations WHERE schedule_id = $1
GROUP BY due_at HAVING count(*) > 1
"""
# What may stay in the bucket once all is quiet (docs/retention.md: Orphan objects and uploads): the published key of a
# SUCCEEDED operation; and whatever a parked FAILED_REPAIR operation holds, left for an operator, its chunks'
# objects included (docs/chunks.md: The janitor and chunks). No chunk's object of an ended export stays.
KEPT_SQL = """
SELECT a.object_key, o.state = 'FAILED_REPAIR' AS parked FROM artifacts a JOIN operations o USING (operation_id)
WHERE (a.state = 'PUBLISHED' AND o.state = 'SUCCEEDED' AND o.result_key = a.object_key)
   OR o.state = 'FAILED_REPAIR'
UNION ALL
SELECT c.object_key, true FROM export_chunks c JOIN operations o USING (operation_id)
WHERE o.state = 'FAILED_REPAIR' AND c.object_key IS NOT NULL
"""
# A chunked export's file is its chunks' recorded outputs and nothing else: every chunk DONE, and their sizes
# adding up to the file's (docs/chunks.md: Assembly); a split result's parts are the chunks that hold a
# message, or the first chunk when none does (docs/chunks.md: Split results).
CHUNKS_SQL = """
SELECT count(*) AS chunks, count(*) FILTER (WHERE state = 'DONE') AS done, coalesce(sum(size_bytes), 0) AS size,
       coalesce(sum(size_bytes) FILTER (WHERE message_count > 0), (array_agg(size_bytes ORDER BY after_seq))[1])
           AS parts_size
FROM export_chunks WHERE operation_id = $1
"""
# A 503 is documented for outages: one counts if it came during a fault or this long after it ended.
OUTAGE_MARGIN_SECONDS = 15.0


@dataclass(frozen=True)
class Deadlines:
    """How long, in seconds after the last repair, the system gets to become quiet in each respect
    (docs/development.md: Development, The fault harness).
    """

    ended: float = 150.0  # every operation of the round terminal or parked
    outbox: float = 30.0  # every due outbox row published, after the broker is back
    queue: float = 30.0  # nothing ready or unacknowledged on the queue
    callbacks: float = 60.0  # every callback delivered, the receiver being back
    orphans: float = 30.0  # the janitor's grace and a pass or two


@dataclass(frozen=True)
class Messages:
    """Every stored message: ``digests[(cid, message_id)]`` of its content, and the recalled ones."""

    digests: dict[tuple[str, str], str]
    recalled: frozenset[tuple[str, str]]


async def read_messages(database_url: str) -> Messages:
    """The message store as it is now."""
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch(MESSAGES_SQL)
    finally:
        await connection.close()
    return Messages(
        {(row["conversation_id"], row["message_id"]): row["digest"] for row in rows},
        frozenset((row["conversation_id"], row["message_id"]) for row in rows if row["recalled"]),
    )


async def database_now(database_url: str) -> datetime:
    """The database's clock now."""
    connection = await asyncpg.connect(database_url)
    try:
        now: datetime = await connection.fetchval("SELECT now()")
        return now
    finally:
        await connection.close()


class Checker:
    """Checks one round of ``system``.

    ``seen`` is what its callers observed, ``before`` the message store at the round's start,
    ``started_at`` the database's clock then; ``deadlines`` how long each respect may take to become quiet,
    counted from ``healed_at`` (monotonic seconds, when every fault was repaired; default: when ``check``
    starts); ``windows`` the faults' (start, end) in monotonic seconds, outside which no 503 is expected;
    ``log_offsets`` the parts' log sizes (bytes) at the round's start, so that only the round's lines are read.
    """

    def __init__(
        self,
        system: ChaosSystem,
        seen: Observations,
        before: Messages,
        deadlines: Deadlines | None = None,
        *,
        started_at: datetime | None = None,
        healed_at: float | None = None,
        windows: Sequence[tuple[float, float]] = (),
        log_offsets: Mapping[Path, int] | None = None,
    ) -> None:
        self.system = system
        self.log_offsets = log_offsets or {}
        self.deadlines = deadlines or Deadlines()
        self.seen = seen
        self.before = before
        self.started_at = started_at or datetime.max.replace(tzinfo=UTC)
        self.healed_at = healed_at
        self.windows = windows
        self.findings: list[str] = []
        # The seqs each SUCCEEDED operation's files hold, in file order, as ``_result`` read them.
        self.files: dict[str, list[int]] = {}
        self.runs = 0
        self.s3 = system.faulty.s3
        self.bucket = system.faulty.settings.s3_bucket
        self.prefix = system.faulty.settings.s3_prefix

    async def check(self) -> list[str]:
        """Every invariant; returns the violations found (each call judges afresh). ``runs`` is then the number
        of the round's schedules' runs it judged.
        """
        self.findings = list(self.seen.problems)
        self.files = {}
        healed_at = self.healed_at if self.healed_at is not None else time.monotonic()
        connection = await asyncpg.connect(self.system.database_url)
        try:
            operations = await self._ended(connection, healed_at + self.deadlines.ended)
            for row in operations:
                await self._operation(connection, row)
            self.runs = sum(row["schedule_id"] in self.seen.scheduled for row in operations)
            for schedule_id in self.seen.scheduled:
                await self._schedule(connection, schedule_id)
            await self._keys(connection)
            await self._messages(connection)
            await self._outbox(connection, healed_at + self.deadlines.outbox)
            await self._queue(healed_at + self.deadlines.queue)
            await self._callbacks(connection, operations, healed_at + self.deadlines.callbacks)
            await self._schedule_callbacks(connection, healed_at + self.deadlines.callbacks)
            await self._orphans(connection, healed_at + self.deadlines.orphans)
        finally:
            await connection.close()
        self._unavailable()
        self.findings += part_log_findings(self.system.log_dir, self.log_offsets)
        return self.findings

    # --- operations -------------------------------------------------------------------------------------

    async def _ended(self, connection: asyncpg.Connection, deadline: float) -> list[asyncpg.Record]:
        """The round's operations once all have ended; one that does not, or that no key of the round
        created, is a violation.
        """

        async def rows() -> list[asyncpg.Record]:
            found: list[asyncpg.Record] = await connection.fetch(
                ROUND_OPERATIONS_SQL, sorted(self.seen.submitted), self.seen.key_prefix, self.started_at
            )
            return found

        await _until(lambda: _all_ended(rows()), deadline)
        found = await rows()
        for row in found:
            operation_id, state = row["operation_id"], row["state"]
            if state not in TERMINAL or state == "EXPIRED":
                self.findings.append(f"{operation_id} is {state} {self.deadlines.ended} s after the repairs")
            if state == "FAILED_REPAIR" and not row["error_code"]:
                self.findings.append(f"{operation_id} parked in FAILED_REPAIR without a reason")
            if not (row["idempotency_key"] or "").startswith(self.seen.key_prefix):
                self.findings.append(f"{operation_id} was created during the round under no key of it")
            elif operation_id in self.seen.submitted:
                self._request(row)
            elif row["schedule_id"] in self.seen.scheduled:
                self._run_request(row)
        missing = set(self.seen.submitted) - {row["operation_id"] for row in found}
        self.findings += [f"{operation_id} was answered to a caller but is not stored" for operation_id in missing]
        return found

    def _request(self, row: asyncpg.Record) -> None:
        """The stored request is the one the caller sent, in canonical form."""
        sent = self.seen.submitted[row["operation_id"]].body
        if _stored_request(row) != _canonical(sent):
            self.findings.append(f"{row['operation_id']} stored {_stored_request(row)}, but the caller sent {sent}")

    def _run_request(self, row: asyncpg.Record) -> None:
        """A run's stored request is its schedule's, in canonical form, but for where it starts (the chain's
        watermark then, which ``_schedule`` judges).
        """
        sent = self.seen.scheduled[row["schedule_id"]].body
        stored = _stored_request(row) | {"after_seq": None}
        if stored != _canonical(sent) | {"after_seq": None}:
            self.findings.append(f"run {row['operation_id']} stored {stored}, but its schedule was sent {sent}")

    async def _schedule(self, connection: asyncpg.Connection, schedule_id: str) -> None:
        """Once its runs have ended: at most one run per due time, each keyed by the latest due time when it
        was created and created after the one before ended (so never two unfinished at once, never a burst),
        and the chain's coverage exact (``tests.support.chains.chain_findings``).
        """
        for row in await connection.fetch(TWICE_DUE_SQL, schedule_id):
            self.findings.append(f"{schedule_id} has runs {sorted(row['runs'])} for one due time {row['due_at']}")
        schedule = await connection.fetchrow(
            "SELECT every, start_at, watermark, (request->>'after_seq')::bigint AS start FROM export_schedules"
            " WHERE schedule_id = $1",
            schedule_id,
        )
        if schedule is None:
            self.findings.append(f"{schedule_id} was answered to a caller but is not stored")
            return
        every = Cadence.parse(schedule["every"])
        runs = await connection.fetch(RUNS_SQL, schedule_id)
        for run in runs:
            if every.latest_due(schedule["start_at"], run["created_at"]) != run["due_at"]:
                self.findings.append(f"run {run['operation_id']} of {schedule_id} is not keyed by its latest due time")
        for earlier, later in itertools.pairwise(runs):
            if earlier["finished_at"] is None or later["created_at"] < earlier["finished_at"]:
                self.findings.append(
                    f"run {later['operation_id']} of {schedule_id} was created before {earlier['operation_id']} ended"
                )
        self.findings += await chain_findings(
            connection, schedule_id, start=schedule["start"] or 0, watermark=schedule["watermark"], files=self.files
        )

    async def _operation(self, connection: asyncpg.Connection, row: asyncpg.Record) -> None:
        operation_id = row["operation_id"]
        objects, uploads = await self._under(artifact_prefix(self.system.faulty.settings, operation_id))
        if row["state"] == "CANCELED" and (objects or uploads):
            await _until(
                lambda: self._empty(artifact_prefix(self.system.faulty.settings, operation_id)), self.deadlines.orphans
            )
            objects, uploads = await self._under(artifact_prefix(self.system.faulty.settings, operation_id))
            if objects or uploads:
                self.findings.append(f"{operation_id} CANCELED but left {sorted(objects | uploads)}")
        if row["state"] == "SUCCEEDED":
            await self._result(connection, row)

    async def _result(self, connection: asyncpg.Connection, row: asyncpg.Record) -> None:
        """The stored file(s) match the record and hold exactly the messages they should."""
        operation_id, kind = row["operation_id"], FileKind(row["format"], row["compression"])
        published = await connection.fetchval(
            "SELECT count(*) FROM artifacts WHERE operation_id = $1 AND object_key = $2 AND state = 'PUBLISHED'",
            operation_id,
            row["result_key"],
        )
        if published != 1:
            self.findings.append(f"{operation_id} SUCCEEDED but no PUBLISHED artifact names {row['result_key']}")
        files = self._recorded_files(row, kind)
        chunked = await connection.fetchrow(CHUNKS_SQL, operation_id)
        size = chunked["size"] if row["max_part_bytes"] is None else chunked["parts_size"]
        recorded = sum(file[1] for file in files)
        if chunked["chunks"] and (chunked["done"], size) != (chunked["chunks"], recorded):
            self.findings.append(f"{operation_id} SUCCEEDED from chunks {dict(chunked)}, not its {recorded} bytes")
        seqs: list[int] = []
        bodies: dict[int, str] = {}
        for key, size, sha256, count in files:
            content = await self._object(key)
            if content is None:
                self.findings.append(f"{operation_id} SUCCEEDED without its object {key}")
                continue
            if (len(content), hashlib.sha256(content).hexdigest()) != (size, sha256):
                self.findings.append(f"{operation_id}: {key} differs from its recorded size or sha256")
            try:
                found = _messages_in(gzip.decompress(content) if kind.compressed else content, kind.format, bodies)
            except (ValueError, KeyError, IndexError, OSError, EOFError) as error:
                self.findings.append(f"{operation_id}: {key} is not a readable {kind.extension} file: {error}")
                continue
            if len(found) != count:
                self.findings.append(f"{operation_id}: {key} holds {len(found)} messages, recorded {count}")
            seqs += found
        if sum(file[3] for file in files) != row["result_message_count"]:
            self.findings.append(f"{operation_id}: the parts' message counts do not add up to the result's")
        self.files[operation_id] = seqs
        await self._selection(connection, operation_id, seqs, bodies)

    def _recorded_files(self, row: asyncpg.Record, kind: FileKind) -> list[tuple[str, int, str, int]]:
        """``(key, size_bytes, sha256, message_count)`` of each stored file of a SUCCEEDED operation."""
        if row["result_parts"] is None:
            return [(row["result_key"], row["result_size_bytes"], row["result_sha256"], row["result_message_count"])]
        parts = json.loads(row["result_parts"])
        return [
            (
                part_key(row["result_key"], part["number"], extension=kind.extension),
                part["size_bytes"],
                part["sha256"],
                part["message_count"],
            )
            for part in parts
        ]

    async def _selection(
        self, connection: asyncpg.Connection, operation_id: str, seqs: list[int], bodies: dict[int, str]
    ) -> None:
        selected = {row["seq"]: row for row in await connection.fetch(SELECTED_SQL, operation_id)}
        if len(seqs) != len(set(seqs)):
            self.findings.append(f"{operation_id}: a message is in its file twice")
        if seqs != sorted(seqs):
            self.findings.append(f"{operation_id}: its file is not in seq order")
        outside = set(seqs) - set(selected)
        missing = {seq for seq, row in selected.items() if row["required"]} - set(seqs)
        if outside:
            self.findings.append(
                f"{operation_id}: its file holds messages outside its selection: {sorted(outside)[:10]}"
            )
        if missing:
            self.findings.append(f"{operation_id}: its file misses messages never recalled: {sorted(missing)[:10]}")
        if await connection.fetchval(BELOW_WATERMARK_SQL, operation_id):
            self.findings.append(f"{operation_id}: its watermark leaves out messages stored before its submit")
        changed = [seq for seq, body in bodies.items() if seq in selected and selected[seq]["body"] != body]
        if changed:
            self.findings.append(f"{operation_id}: its file changed the bodies of {sorted(changed)[:10]}")

    async def _keys(self, connection: asyncpg.Connection) -> None:
        """Each key names one operation (or schedule), for every caller that used it, and the stored one."""
        for (user, key), answered in self.seen.answers.items():
            stored = await connection.fetchval(
                "SELECT coalesce(operation_id, schedule_id) FROM idempotency_keys"
                " WHERE owner_id = $1 AND idempotency_key = $2",
                user,
                key,
            )
            if len(answered) != 1 or stored not in answered:
                self.findings.append(f"key {key} of {user} answered {sorted(answered)}, stored {stored}")

    async def _messages(self, connection: asyncpg.Connection) -> None:
        """No message changed, and none recalled that was not recalled by a caller."""
        after = await read_messages(self.system.database_url)
        changed = [key for key, digest in self.before.digests.items() if after.digests.get(key) != digest]
        if changed:
            self.findings.append(f"messages changed or lost during the round: {sorted(changed)[:10]}")
        unrecalled = self.before.recalled - after.recalled
        if unrecalled:
            self.findings.append(f"recalled messages came back: {sorted(unrecalled)[:10]}")
        recalled_by_nobody = after.recalled - self.before.recalled - self.seen.recalls
        if recalled_by_nobody:
            self.findings.append(f"messages recalled that no caller recalled: {sorted(recalled_by_nobody)[:10]}")

    # --- outbox, queue, callbacks, storage --------------------------------------------------------------

    async def _outbox(self, connection: asyncpg.Connection, deadline: float) -> None:
        """Every due row published by ``deadline``; a row the relay failed to publish counts as due."""

        async def unpublished() -> int:
            count: int = await connection.fetchval(
                "SELECT count(*) FROM outbox WHERE published_at IS NULL"
                " AND (not_before <= now() OR publish_attempts > 0)"
            )
            return count

        if not await _until(lambda: _is_zero(unpublished()), deadline):
            self.findings.append(
                f"{await unpublished()} outbox rows unpublished {self.deadlines.outbox} s after the broker was back"
            )

    async def _queue(self, deadline: float) -> None:
        queue = self.system.faulty.settings.amqp_queue

        async def counts() -> dict[str, int]:
            return await asyncio.to_thread(self.system.queue_counts, queue)

        async def drained() -> bool:
            return set((await counts()).values()) == {0}

        try:
            if not await _until(drained, deadline):
                self.findings.append(
                    f"the queue is not drained {self.deadlines.queue} s after the round: {await counts()}"
                )
        except (ServerError, KeyError) as error:
            self.findings.append(f"the queue could not be read: {error!r}")

    async def _callbacks(
        self, connection: asyncpg.Connection, operations: list[asyncpg.Record], deadline: float
    ) -> None:
        """Every ended operation with a callback URL has its events delivered, each under its own id."""
        with_callbacks = [row["operation_id"] for row in operations if row["notify_url"]]

        async def deliveries() -> list[asyncpg.Record]:
            return await connection.fetch(
                "SELECT operation_id, webhook_id, delivered_at FROM webhook_deliveries WHERE operation_id = ANY($1)",
                with_callbacks,
            )

        async def all_delivered() -> bool:
            rows = await deliveries()
            return all(row["delivered_at"] is not None for row in rows) and {r["operation_id"] for r in rows} == set(
                operation_id for operation_id in with_callbacks if _ended_row(operations, operation_id)
            )

        await _until(all_delivered, deadline)
        rows = await deliveries()
        for operation_id in with_callbacks:
            stored = {row["webhook_id"] for row in rows if row["operation_id"] == operation_id}
            delivered = {
                row["webhook_id"] for row in rows if row["operation_id"] == operation_id and row["delivered_at"]
            }
            received = self.system.receiver.received.get(operation_id, set())
            if not stored:
                self.findings.append(f"{operation_id} ended without a callback to deliver")
            if delivered != stored or not delivered <= received:
                self.findings.append(
                    f"{operation_id}: callbacks {sorted(stored)}, delivered {sorted(delivered)},"
                    f" received {sorted(received)}"
                )
            if received - stored:
                self.findings.append(f"{operation_id}: callbacks arrived with unknown ids {sorted(received - stored)}")

    async def _schedule_callbacks(self, connection: asyncpg.Connection, deadline: float) -> None:
        """Every callback of the round's schedules (a pause of the system's) delivered, each under its own id."""

        async def deliveries() -> list[asyncpg.Record]:
            return await connection.fetch(
                "SELECT schedule_id, webhook_id, delivered_at FROM webhook_deliveries WHERE schedule_id = ANY($1)",
                list(self.seen.scheduled),
            )

        async def all_delivered() -> bool:
            return all(row["delivered_at"] is not None for row in await deliveries())

        await _until(all_delivered, deadline)
        rows = await deliveries()
        for schedule_id in self.seen.scheduled:
            stored = {row["webhook_id"] for row in rows if row["schedule_id"] == schedule_id}
            delivered = {row["webhook_id"] for row in rows if row["schedule_id"] == schedule_id and row["delivered_at"]}
            received = self.system.receiver.received.get(schedule_id, set())
            if delivered != stored or received != stored:
                self.findings.append(
                    f"{schedule_id}: callbacks {sorted(stored)}, delivered {sorted(delivered)},"
                    f" received {sorted(received)}"
                )

    async def _orphans(self, connection: asyncpg.Connection, deadline: float) -> None:
        """By ``deadline`` (the janitor's grace and a few passes), only what may stay is in the bucket."""

        async def unexplained() -> set[str]:
            kept = await connection.fetch(KEPT_SQL)
            published = [row["object_key"] for row in kept]
            parked = [row["object_key"] for row in kept if row["parked"]]
            objects, uploads = await self._under(self.prefix)
            return {key for key in objects if not _named(key, published)} | {
                f"upload of {key}" for key in uploads if not _named(key, parked)
            }

        async def none_unexplained() -> bool:
            return not await unexplained()

        if not await _until(none_unexplained, deadline):
            self.findings.append(f"objects or uploads no live record names: {sorted(await unexplained())[:10]}")

    def _unavailable(self) -> None:
        """Each 503 a caller got came during a fault, or soon after one ended."""
        for moment in self.seen.unavailable:
            if not any(start <= moment <= end + OUTAGE_MARGIN_SECONDS for start, end in self.windows):
                self.findings.append("a 503 answer while no fault was in place")
                return

    # --- S3 -----------------------------------------------------------------------------------------------

    async def _under(self, prefix: str) -> tuple[set[str], set[str]]:
        """Keys of the objects and of the open multipart uploads under ``prefix``."""
        objects: set[str] = set()
        paginator = self.s3.get_paginator("list_objects_v2")
        async for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
            objects |= {item["Key"] for item in page.get("Contents", [])}
        listed = await self.s3.list_multipart_uploads(Bucket=self.bucket, Prefix=prefix)
        return objects, {item["Key"] for item in listed.get("Uploads", [])}

    async def _empty(self, prefix: str) -> bool:
        objects, uploads = await self._under(prefix)
        return not objects and not uploads

    async def _object(self, key: str) -> bytes | None:
        try:
            response = await self.s3.get_object(Bucket=self.bucket, Key=key)
        except self.s3.exceptions.NoSuchKey:
            return None
        async with response["Body"] as body:
            content: bytes = await body.read()
            return content


def _messages_in(content: bytes, file_format: str, bodies: dict[int, str]) -> list[int]:
    """The seqs of the messages in one file, in file order; JSONL bodies go into ``bodies``."""
    if file_format == "jsonl":
        messages = [json.loads(line) for line in content.splitlines()]
        bodies.update({message["seq"]: message["body"] for message in messages})
        return [message["seq"] for message in messages]
    if file_format == "csv":
        rows = list(csv.reader(io.StringIO(content.decode("utf-8"), newline="")))
        return [int(row[1]) for row in rows[1:]]
    return [int(seq) for seq in HTML_MESSAGE.findall(content)]


def _named(key: str, live: list[str]) -> bool:
    """True when ``key`` is a live artifact's object, or one of a live split artifact's parts."""
    return any(key == name or (is_folder(name) and key.startswith(name)) for name in live)


def _ended_row(operations: list[asyncpg.Record], operation_id: str) -> bool:
    return any(row["operation_id"] == operation_id and row["state"] in TERMINAL for row in operations)


async def _all_ended(rows: Awaitable[list[asyncpg.Record]]) -> bool:
    return all(row["state"] in TERMINAL for row in await rows)


async def _is_zero(count: Awaitable[int]) -> bool:
    return await count == 0


async def _until(predicate: Callable[[], Awaitable[bool]], deadline: float) -> bool:
    """Poll ``predicate`` until it is true (True) or the monotonic clock passes ``deadline`` (False); it is
    asked at least once.
    """
    while True:
        if await predicate():
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(POLL_SECONDS)  # polling the system's state


def _stored_request(row: asyncpg.Record) -> dict[str, Any]:
    """An operation's stored request, as ``_canonical`` gives a body."""
    return {
        "format": row["format"],
        "compression": row["compression"],
        "after_seq": row["after_seq"],
        "before_seq": row["before_seq"],
        "senders": sorted(row["senders"]) if row["senders"] is not None else None,
        "since": row["since"],
        "until": row["until"],
        "max_part_bytes": row["max_part_bytes"],
        "notify_url": row["notify_url"],
    }


def _canonical(body: dict[str, Any]) -> dict[str, Any]:
    """A request body as the operation row stores it (docs/api.md: Submitting an export, Export options)."""
    senders = body.get("senders")
    return {
        "format": body.get("format", "jsonl"),
        "compression": body.get("compression", "none"),
        "after_seq": body.get("after_seq", 0),
        "before_seq": body.get("before_seq"),
        "senders": sorted(set(senders)) if senders is not None else None,
        "since": datetime.fromisoformat(body["since"]) if "since" in body else None,
        "until": datetime.fromisoformat(body["until"]) if "until" in body else None,
        "max_part_bytes": body.get("max_part_bytes"),
        "notify_url": (body.get("notify") or {}).get("url"),
    }


def part_log_findings(log_dir: Path, offsets: Mapping[Path, int]) -> list[str]:
    """What the parts' logs in ``log_dir`` say went wrong since ``offsets`` (bytes per file): a part that died
    of an uncaught error, and an error the API answered as internal. Both hide from the other checks, because
    the repairs restart a dead part and a download's status line is sent before its failure.
    """
    findings = []
    for name in PARTS:
        path = log_dir / f"{name}.log"
        if not path.exists():
            continue
        with path.open("rb") as log:
            log.seek(offsets.get(path, 0))
            lines = log.read().decode(errors="replace").splitlines()
        if any(line.startswith(CRASH_STARTS) for line in lines):
            errors = [match.group(1) for line in lines if (match := ERROR_LINE.match(line))]
            findings.append(f"{name} died of an uncaught error: {errors[-1] if errors else 'unknown'}")
        unhandled = sum('"msg": "unhandled error"' in line for line in lines)
        if unhandled:
            findings.append(f"{name} logged {unhandled} unhandled error(s)")
    return findings
