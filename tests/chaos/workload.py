"""A round's workload, as callers would drive the API while things break (docs/development.md: Development, The fault
harness): conversations to export, submits with duplicates under one key, cancels at random moments,
recalls and membership changes during exports, downloads, some aborted; and incremental export schedules firing
every second or two while messages are sent and recalled, one paused and resumed, each paused for good at its end
while a watcher looks for a schedule with two unfinished runs at once.

Every request is retried, as a careful client would, on a lost connection and on 503 until its deadline;
every answer is recorded in ``Observations`` so that the checker can judge it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import random
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import asyncpg

from shared.db import TRANSIENT_DATABASE_ERRORS
from shared.states import ACTIVE
from tests.chaos.plan import ExportSpec, RoundPlan, ScheduleSpec
from tests.chaos.system import ChaosSystem

REQUEST_TIMEOUT_SECONDS = 5.0
# A request is given up after this long of lost connections and 503s: longer than any fault lasts.
REQUEST_DEADLINE_SECONDS = 90.0
RETRY_PAUSE_SECONDS = 0.2
END_DEADLINE_SECONDS = 150.0
MEMBERS = ("alice", "bob")
BIG = "big"
BIG_MESSAGES = 40_000
IMPORT_BATCH = 5000
# Message times start here, a minute apart, so that the plan's since/until windows select some of them.
FIRST_SENT_AT = datetime(2025, 12, 31, 21, 0, tzinfo=UTC)
# Bodies that exercise CSV's formula guard, HTML escaping and right-to-left text.
BODY_SAMPLES = ("plain {n}", "=SUM(A1:A{n})", "<script>alert({n})</script>", "שלום {n}", "+{n} @x", "-{n}\ttab")
TERMINAL = {"SUCCEEDED", "CANCELED", "FAILED", "FAILED_REPAIR", "EXPIRED"}
# How often the watcher looks for a schedule with more than one unfinished run.
WATCH_SECONDS = 0.2
# Schedules of the round with more than one unfinished run, and those runs.
OVERLAPPING_RUNS_SQL = """
SELECT schedule_id, array_agg(operation_id ORDER BY due_at) AS runs FROM operations
WHERE schedule_id = ANY($1) AND state = ANY($2) GROUP BY schedule_id HAVING count(*) > 1
"""
_ACTIVE_STATES = sorted(ACTIVE)


class RequestGivenUp(Exception):
    """A request got no answer other than lost connections and 503s within its deadline."""


@dataclass
class Submitted:
    """One export the workload asked for: who, where, with which key and body."""

    spec: ExportSpec
    user: str
    conversation_id: str
    key: str
    body: dict[str, Any]


@dataclass
class Scheduled:
    """One schedule the workload created: who, where, with which key and body (its ``every``, ``mode`` and export
    options).
    """

    spec: ScheduleSpec
    user: str
    conversation_id: str
    key: str
    body: dict[str, Any]


@dataclass
class Observations:
    """What callers saw: ``answers[(user, key)]`` the operation (or schedule) ids submits (or schedule creations)
    with that key were given; ``submitted[operation_id]``; ``scheduled[schedule_id]``; ``key_prefix`` that every
    key of the round starts with; ``recalls`` the ``(cid, message_id)`` callers recalled (or tried to);
    ``unavailable`` the monotonic times of the 503s they got; ``problems``: answers no caller should ever get,
    and schedules seen with two unfinished runs at once; ``requests`` sent, ``downloads`` verified.
    """

    key_prefix: str = ""
    answers: defaultdict[tuple[str, str], set[str]] = field(default_factory=lambda: defaultdict(set))
    submitted: dict[str, Submitted] = field(default_factory=dict)
    scheduled: dict[str, Scheduled] = field(default_factory=dict)
    recalls: set[tuple[str, str]] = field(default_factory=set)
    unavailable: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    requests: int = 0
    downloads: int = 0


class Workload:
    """Drives ``plan``'s exports against ``system``; ``log(text)`` records each step."""

    def __init__(self, system: ChaosSystem, plan: RoundPlan, log: Callable[[str], None]) -> None:
        self.system = system
        self.plan = plan
        self.log = log
        self.seen = Observations(key_prefix=f"s{plan.seed}-r{plan.round_number}-")
        # A stopped api must not hold a request for ever; a large download may take longer than one read.
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=REQUEST_TIMEOUT_SECONDS, sock_read=REQUEST_TIMEOUT_SECONDS
        )
        self._http = aiohttp.ClientSession(base_url=system.faulty.system.base_url, timeout=timeout)
        self._dropped: set[tuple[str, str]] = set()

    async def restore(self) -> None:
        """Give every membership the round took away back."""
        for cid, user in sorted(self._dropped):
            await self._request("PUT", f"/admin/conversations/{cid}/members/{user}", admin=True, accept=(204,))
        self._dropped.clear()

    async def delete_schedules(self) -> None:
        """Delete the round's schedules, once judged: a user may have only so many."""
        for schedule_id, scheduled in sorted(self.seen.scheduled.items()):
            path = f"/v3/export-schedules/{schedule_id}"
            await self._request("DELETE", path, user=scheduled.user, accept=(204, 404))

    async def close(self) -> None:
        """Close the HTTP session."""
        await self._http.close()

    def conversation_id(self, conversation: str) -> str:
        """The id of the plan's conversation ``"big"`` or ``"<index>"``."""
        if conversation == BIG:
            return BIG
        return f"s{self.plan.seed}-r{self.plan.round_number}-c{conversation}"

    def schedule_conversation_id(self, number: int) -> str:
        """The id of the conversation of the plan's schedule ``number``."""
        return f"s{self.plan.seed}-r{self.plan.round_number}-sched{number}"

    async def prepare_big(self) -> None:
        """Create the run's large conversation once (enough for several parts of the smallest size)."""
        status, _, _ = await self._request("GET", f"/admin/conversations/{BIG}", admin=True, accept=(200, 404))
        if status == 404:
            await self._create(BIG, BIG_MESSAGES, body_bytes=200)

    async def prepare(self) -> None:
        """Create the round's own conversations and their messages, the schedules' included."""
        for index, size in enumerate(self.plan.conversation_sizes):
            await self._create(self.conversation_id(str(index)), size, body_bytes=0)
        for number, spec in enumerate(self.plan.schedules):
            await self._create(self.schedule_conversation_id(number), spec.size, body_bytes=0)

    async def run(self) -> None:
        """Run every export and schedule of the plan, each starting at its moment, while the watcher looks at
        the schedules' runs; return when all are done (every schedule paused).
        """
        scheduling = asyncio.gather(*(self._schedule(number, spec) for number, spec in enumerate(self.plan.schedules)))
        watching = asyncio.create_task(self._watch(scheduling))
        try:
            await asyncio.gather(
                *(self._export(number, spec) for number, spec in enumerate(self.plan.exports)), scheduling
            )
        finally:
            await watching

    # --- one export -------------------------------------------------------------------------------------

    async def _export(self, number: int, spec: ExportSpec) -> None:
        await asyncio.sleep(spec.at_seconds)  # the plan's moment for this export
        rng = random.Random(f"{self.plan.seed}:{self.plan.round_number}:{number}")
        cid = self.conversation_id(spec.conversation)
        body = dict(spec.options)
        if "notify" in body:
            body["notify"] = {"url": self.system.receiver.url}
        submitted = Submitted(spec, spec.user, cid, f"{self.seen.key_prefix}e{number}", body)
        answers = await asyncio.gather(*(self._submit(submitted) for _ in range(1 + spec.duplicates)))
        operation_id = next((answer for answer in answers if answer), None)
        if operation_id is None:
            return
        self.seen.submitted[operation_id] = submitted
        self.log(f"export {number} is {operation_id} in {cid}: {json.dumps(body)}")
        await asyncio.gather(
            self._cancel_later(operation_id, spec.cancel_after),
            self._recall(rng, spec.conversation, spec.recalls),
            self._drop_member(cid, spec.user, spec.drop_member),
            self._send(cid, number, spec.live_messages),
        )
        if spec.download:
            await self._download(operation_id, spec.user, aborted=spec.download == "aborted")

    async def _submit(self, submitted: Submitted) -> str | None:
        """One submit; the operation id it answered with, or None when it was refused (a 4xx)."""
        status, answer, _ = await self._request(
            "POST",
            f"/v3/conversations/{submitted.conversation_id}/exports",
            user=submitted.user,
            json_body=submitted.body,
            headers={"Idempotency-Key": submitted.key},
            accept=(202,),
            member=(submitted.conversation_id, submitted.user),
        )
        if status >= 400:
            self.log(f"submit {submitted.key} refused: {status} {answer!r:.200}")
            return None
        operation_id: str = json.loads(answer)["operation_id"]
        self.seen.answers[(submitted.user, submitted.key)].add(operation_id)
        return operation_id

    async def _cancel_later(self, operation_id: str, after: float | None) -> None:
        if after is None:
            return
        await asyncio.sleep(after)  # the plan's moment for the cancel
        submitted = self.seen.submitted[operation_id]
        path = f"/v3/operations/{operation_id}/cancel"
        member = (submitted.conversation_id, submitted.user)
        status, _, _ = await self._request("POST", path, user=submitted.user, accept=(200, 202, 409), member=member)
        self.log(f"cancel {operation_id}: {status}")

    async def _recall(self, rng: random.Random, conversation: str, count: int) -> None:
        cid = self.conversation_id(conversation)
        size = BIG_MESSAGES if conversation == BIG else self.plan.conversation_sizes[int(conversation)]
        for number in rng.sample(range(size), min(count, size)):
            await self._recall_message(cid, _message_id(cid, number), MEMBERS[number % 2])

    async def _send(self, cid: str, export: int, count: int) -> None:
        """Members send ``count`` messages while the export runs; a retried send may meet its own first try."""
        for number in range(count):
            user = MEMBERS[number % 2]
            body = {"message_id": f"{self.seen.key_prefix}e{export}-live{number}", "body": "live"}
            await self._request(
                "POST",
                f"/v2/conversations/{cid}/messages",
                user=user,
                json_body=body,
                accept=(200, 409),
                member=(cid, user),
            )

    async def _drop_member(self, cid: str, user: str, drop: bool) -> None:
        if drop:
            self._dropped.add((cid, user))
            status, _, _ = await self._request(
                "DELETE", f"/admin/conversations/{cid}/members/{user}", admin=True, accept=(204,)
            )
            self.log(f"removed {user} from {cid}: {status}")

    async def _download(self, operation_id: str, user: str, *, aborted: bool) -> None:
        """Wait for the end; download a result (each part of a split one) and compare it with its sha256. An
        aborted download closes the connection part-way and resumes with ``Range`` and ``If-Match``.
        """
        operation = await self._ended(operation_id, user)
        result = (operation or {}).get("result")
        if not result or operation is None or operation["state"] != "SUCCEEDED":
            return
        member = (self.seen.submitted[operation_id].conversation_id, user)
        for url, sha256 in _files(operation_id, result):
            deadline = time.monotonic() + REQUEST_DEADLINE_SECONDS
            outcome = await self._verified(url, member, sha256, aborted=aborted, deadline=deadline)
            if outcome == "unverified":
                self.seen.problems.append(f"{url}: no verified download within {REQUEST_DEADLINE_SECONDS} s")
            self.seen.downloads += outcome == "verified"

    async def _verified(self, url: str, member: tuple[str, str], sha256: str, *, aborted: bool, deadline: float) -> str:
        """Download ``url`` until its bytes are whole: ``"verified"``, ``"refused"`` (the user left the
        conversation, or a wrong answer, recorded as a problem) or ``"unverified"`` when ``deadline`` passed.
        """
        content, etag = b"", ""
        while time.monotonic() < deadline:
            headers = self.system.auth(member[1]) | (
                {"Range": f"bytes={len(content)}-", "If-Match": etag} if content else {}
            )
            try:
                async with self._http.get(url, headers=headers) as response:
                    if response.status not in (200, 206):
                        if not await self._refusal_is_expected(response, url, member=member):
                            return "refused"
                        await asyncio.sleep(RETRY_PAUSE_SECONDS)  # 429 or 503: a client's pause, then again
                        continue
                    etag = response.headers["ETag"]
                    body = await self._read(response, aborted)
                    content = content + body if response.status == 206 else body
            except (aiohttp.ClientError, asyncio.IncompleteReadError, TimeoutError) as error:
                self.log(f"download of {url} cut off: {error!r}")
                await asyncio.sleep(RETRY_PAUSE_SECONDS)  # cut off by a fault: resumed from what arrived
                continue
            if not aborted or len(content) < 2:
                if hashlib.sha256(content).hexdigest() == sha256:
                    return "verified"
                self.seen.problems.append(f"GET {url}: the downloaded bytes do not match the result's sha256")
                return "refused"
            aborted = False
        return "unverified"

    async def _refusal_is_expected(
        self, response: aiohttp.ClientResponse, url: str, *, member: tuple[str, str]
    ) -> bool:
        """Record an answer other than 200/206; True when the client should try again (429, 503). 403 and 404
        are expected only once the round has removed ``member`` (conversation, user).
        """
        answer = await response.read()
        self._note(response.status, "GET", url, answer)
        if response.status in (429, 503):
            return True
        if not (member in self._dropped and response.status in (403, 404)):
            self.seen.problems.append(f"GET {url} answered {response.status}: {answer[:300]!r}")
        return False

    @staticmethod
    async def _read(response: aiohttp.ClientResponse, abort: bool) -> bytes:
        """The body; or, for an aborted download, half of it before the connection is closed (a file of
        less than two bytes cannot be cut: it is read whole).
        """
        half = (response.content_length or 0) // 2
        if not abort or not half:
            return await response.read()
        received = await response.content.readexactly(half)
        response.close()  # the client goes away mid-file
        return received

    async def _ended(self, operation_id: str, user: str) -> dict[str, Any] | None:
        deadline = time.monotonic() + END_DEADLINE_SECONDS
        while time.monotonic() < deadline:
            member = (self.seen.submitted[operation_id].conversation_id, user)
            path = f"/v3/operations/{operation_id}?wait=3"
            status, answer, _ = await self._request("GET", path, user=user, member=member)
            if status != 200:
                return None
            operation: dict[str, Any] = json.loads(answer)
            if operation["state"] in TERMINAL:
                return operation
        return None

    # --- one schedule -----------------------------------------------------------------------------------

    async def _schedule(self, number: int, spec: ScheduleSpec) -> None:
        await asyncio.sleep(spec.at_seconds)  # the plan's moment for this schedule
        rng = random.Random(f"{self.plan.seed}:{self.plan.round_number}:schedule{number}")
        cid = self.schedule_conversation_id(number)
        body = {"every": spec.every, "mode": "incremental", **spec.options}
        if "notify" in body:
            body["notify"] = {"url": self.system.receiver.url}
        scheduled = Scheduled(spec, spec.user, cid, f"{self.seen.key_prefix}sched{number}", body)
        answers = await asyncio.gather(*(self._create_schedule(scheduled) for _ in range(1 + spec.duplicates)))
        schedule_id = next((answer for answer in answers if answer), None)
        if schedule_id is None:
            return
        self.seen.scheduled[schedule_id] = scheduled
        self.log(f"schedule {number} is {schedule_id} in {cid}: {json.dumps(body)}")
        await asyncio.gather(
            asyncio.sleep(spec.runs_for),  # the plan's time for the schedule to fire
            self._pause_and_resume(schedule_id, scheduled),
            self._chat(rng, cid, number, spec),
        )
        await self._schedule_action(schedule_id, scheduled, "pause", accept=(200,))

    async def _create_schedule(self, scheduled: Scheduled) -> str | None:
        """One creation; the schedule id it answered with, or None when it was refused (a 4xx)."""
        status, answer, _ = await self._request(
            "POST",
            f"/v3/conversations/{scheduled.conversation_id}/export-schedules",
            user=scheduled.user,
            json_body=scheduled.body,
            headers={"Idempotency-Key": scheduled.key},
            accept=(201,),
        )
        if status >= 400:
            self.log(f"schedule {scheduled.key} refused: {status} {answer!r:.200}")
            return None
        schedule_id: str = json.loads(answer)["schedule_id"]
        self.seen.answers[(scheduled.user, scheduled.key)].add(schedule_id)
        return schedule_id

    async def _pause_and_resume(self, schedule_id: str, scheduled: Scheduled) -> None:
        """The owner's pause at the plan's moment, and the resume after it. A resume is refused while a run
        waits for repair (a fault may leave one parked).
        """
        if scheduled.spec.pause_at is None:
            return
        await asyncio.sleep(scheduled.spec.pause_at)  # the plan's moment for the pause
        await self._schedule_action(schedule_id, scheduled, "pause", accept=(200,))
        await asyncio.sleep(scheduled.spec.pause_for)  # the plan's length of the pause
        await self._schedule_action(schedule_id, scheduled, "resume", accept=(200, 422))

    async def _schedule_action(
        self, schedule_id: str, scheduled: Scheduled, action: str, *, accept: tuple[int, ...]
    ) -> None:
        path = f"/v3/export-schedules/{schedule_id}/{action}"
        status, answer, _ = await self._request("POST", path, user=scheduled.user, accept=accept)
        if status == 422 and b'"SCHEDULE_NEEDS_REPAIR"' not in answer:
            self.seen.problems.append(f"POST {path} answered 422: {answer[:300]!r}")
        self.log(f"{action} {schedule_id}: {status}")

    async def _chat(self, rng: random.Random, cid: str, number: int, spec: ScheduleSpec) -> None:
        """Members send the plan's messages, evenly spread over the schedule's time, and recall some of the
        conversation's messages, imported or sent, at random moments.
        """
        sent = [_message_id(cid, n) for n in range(spec.size)]
        pace = spec.runs_for / (spec.live_messages + 1)
        recalls = set(rng.sample(range(spec.live_messages), min(spec.recalls, spec.live_messages)))
        for live in range(spec.live_messages):
            await asyncio.sleep(pace)  # the plan's spread of the messages over the schedule's time
            user = MEMBERS[(spec.size + live) % 2]
            message_id = f"{self.seen.key_prefix}sched{number}-live{live}"
            await self._request(
                "POST",
                f"/v2/conversations/{cid}/messages",
                user=user,
                json_body={"message_id": message_id, "body": "live"},
                accept=(200, 409),
            )
            sent.append(message_id)
            if live in recalls:
                index = rng.randrange(len(sent))
                await self._recall_message(cid, sent[index], MEMBERS[index % 2])  # the senders take turns

    async def _recall_message(self, cid: str, message_id: str, sender: str) -> None:
        """``sender`` recalls ``message_id``: only the sender may, member or not (docs/api.md:
        Message store).
        """
        self.seen.recalls.add((cid, message_id))
        path = f"/v2/conversations/{cid}/messages/{message_id}"
        status, _, _ = await self._request("DELETE", path, user=sender, accept=(200,))
        self.log(f"recall {cid}/{message_id}: {status}")

    async def _watch(self, scheduling: asyncio.Future[Any]) -> None:
        """Until ``scheduling`` is done, look every ``WATCH_SECONDS`` for a schedule of the round with more than
        one unfinished run; each one seen is a problem. A database that cannot be reached is looked at again.
        """
        connection: asyncpg.Connection | None = None
        try:
            while not scheduling.done():
                with contextlib.suppress(*TRANSIENT_DATABASE_ERRORS):
                    if connection is None or connection.is_closed():
                        connection = await asyncpg.connect(self.system.database_url, timeout=2)
                    rows = await connection.fetch(
                        OVERLAPPING_RUNS_SQL, list(self.seen.scheduled), _ACTIVE_STATES, timeout=2
                    )
                    for row in rows:
                        overlapping = f"{row['schedule_id']} had unfinished runs at once: {row['runs']}"
                        if overlapping not in self.seen.problems:
                            self.seen.problems.append(overlapping)
                await asyncio.wait([scheduling], timeout=WATCH_SECONDS)
        finally:
            if connection is not None:
                connection.terminate()

    # --- set-up and requests ----------------------------------------------------------------------------

    async def _create(self, cid: str, size: int, *, body_bytes: int) -> None:
        await self._request(
            "PUT", f"/admin/conversations/{cid}", admin=True, json_body={"members": list(MEMBERS)}, accept=(204,)
        )
        filler = "x" * body_bytes
        for start in range(0, size, IMPORT_BATCH):
            lines = "".join(
                json.dumps(
                    {
                        "message_id": _message_id(cid, n),
                        "sender_id": MEMBERS[n % 2],
                        "body": BODY_SAMPLES[n % len(BODY_SAMPLES)].format(n=n) + filler,
                        "sent_at": (FIRST_SENT_AT + timedelta(minutes=n % 600)).isoformat(),
                    }
                )
                + "\n"
                for n in range(start, min(start + IMPORT_BATCH, size))
            )
            await self._request(
                "POST",
                f"/admin/conversations/{cid}/messages:import",
                admin=True,
                data=lines.encode(),
                headers={"Content-Type": "application/x-ndjson"},
                accept=(200,),
            )

    async def _request(
        self,
        method: str,
        path: str,
        *,
        user: str = "",
        admin: bool = False,
        json_body: Any = None,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
        accept: tuple[int, ...] = (200,),
        member: tuple[str, str] | None = None,
    ) -> tuple[int, bytes, dict[str, str]]:
        """Send until an answer other than 503 comes; retry lost connections, timeouts and 503s. A status
        outside ``accept`` is recorded as a problem and returned, except 403 and 404 when ``member``
        (conversation, user) has been removed by the round by the time the answer comes. Raises
        ``RequestGivenUp`` after ``REQUEST_DEADLINE_SECONDS``.
        """
        auth = self.system.auth("root" if admin else user, admin=admin)
        deadline = time.monotonic() + REQUEST_DEADLINE_SECONDS
        while time.monotonic() < deadline:
            try:
                async with self._http.request(
                    method, path, json=json_body, data=data, headers={**auth, **(headers or {})}
                ) as response:
                    answer = await response.read()
                    status = response.status
            except (aiohttp.ClientError, TimeoutError):
                await asyncio.sleep(RETRY_PAUSE_SECONDS)  # a client's pause before it tries again
                continue
            self._note(status, method, path, answer)
            if status == 503:
                await asyncio.sleep(RETRY_PAUSE_SECONDS)
                continue
            if status not in accept and not (status in (403, 404) and member in self._dropped):
                self.seen.problems.append(f"{method} {path} answered {status}: {answer[:300]!r}")
            return status, answer, dict(response.headers)
        raise RequestGivenUp(f"{method} {path}: no answer within {REQUEST_DEADLINE_SECONDS} s")

    def _note(self, status: int, method: str, path: str, answer: bytes = b"") -> None:
        """Count a request; a 5xx other than the documented 503 is a problem (docs/api.md: Error codes)."""
        self.seen.requests += 1
        if status == 503:
            self.seen.unavailable.append(time.monotonic())
        if status >= 500 and status != 503:
            self.seen.problems.append(f"{method} {path} answered {status}: {answer[:300]!r}")
        if status == 503 and b'"SERVICE_UNAVAILABLE"' not in answer:
            self.seen.problems.append(f"{method} {path} answered 503 without SERVICE_UNAVAILABLE: {answer[:300]!r}")


def _message_id(cid: str, number: int) -> str:
    return f"{cid}-m{number}"


def _files(operation_id: str, result: dict[str, Any]) -> list[tuple[str, str]]:
    """``(url, sha256)`` of each file of a result: the parts of a split one, else the one file."""
    if result.get("parts"):
        return [(part["url"], part["sha256"]) for part in result["parts"]]
    return [(f"/v3/exports/{operation_id}/result", result["sha256"])]
