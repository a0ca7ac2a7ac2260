"""The export schedules' HTTP API on the real servers (docs/api.md: Export schedules): creation in the submit's
order and key space, replays, the per-user limit, the one hidden 404, the 422s with their codes, pause and
resume, deletion, and the keyset pages of schedules and of runs.
"""

from __future__ import annotations

import gzip
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from multidict import CIMultiDict

from services.api.http.schemas import Operation, Schedule
from shared.ids import new_operation_id
from shared.repository import schedule_runs
from shared.repository.schedule_runs import FireOutcome
from shared.settings import Settings
from shared.timefmt import format_timestamp, parse_timestamp
from tests.support.api_calls import expect_problem, make_conversation, submit
from tests.support.exports import Auth, Client
from tests.support.rows import insert_operation

pytestmark = pytest.mark.module_database

CREATE = "/v3/conversations/{cid}/export-schedules"
LIST = "/v3/export-schedules"
DAILY = {"every": "P1D"}
# An id that was never handed out, with the shape of a real one.
GUESSED_ID = "sch_AAAAAAAAAAAAAAAAAAAAAAAA"


@pytest.fixture
async def members(api: Client, auth: Auth) -> None:
    """``c-a`` with alice and bob; ``c-other`` with carol only."""
    await make_conversation(api, auth, "c-a", ["alice", "bob"])
    await make_conversation(api, auth, "c-other", ["carol"])


async def create(api: Client, auth: Auth, body: Any, key: str, *, user: str = "alice", cid: str = "c-a") -> Any:
    return await api.post(CREATE.format(cid=cid), json=body, headers={**auth(user), "Idempotency-Key": key})


async def created(api: Client, auth: Auth, body: Any, key: str, *, user: str = "alice") -> dict[str, Any]:
    """The schedule a creation answered, checked against its model and its ``Location``."""
    response = await create(api, auth, body, key, user=user)
    assert response.status == 201, await response.text()
    schedule: dict[str, Any] = await response.json()
    Schedule.model_validate(schedule)
    assert response.headers["Location"] == schedule["links"]["self"] == f"{LIST}/{schedule['schedule_id']}"
    assert response.headers["Cache-Control"] == "no-store"
    return schedule


async def call(api: Client, auth: Auth, method: str, url: str, *, user: str = "alice", **kwargs: Any) -> Any:
    return await api.request(method, url, headers=auth(user), **kwargs)


async def current(api: Client, auth: Auth, schedule_id: str, *, user: str = "alice") -> dict[str, Any]:
    response = await call(api, auth, "GET", f"{LIST}/{schedule_id}", user=user)
    assert response.status == 200, await response.text()
    schedule: dict[str, Any] = await response.json()
    return schedule


async def test_create_answers_201_with_the_schedule(api: Client, auth: Auth, members: None) -> None:
    body = {
        "every": "pt6h",
        "start_at": "2024-05-01T10:00:00+02:00",
        "mode": "full",
        "format": "csv",
        "after_seq": 7,
        "since": "2024-01-01T00:00:00.0001Z",
        "senders": ["bob", "alice", "bob"],
        "compression": "gzip",
        "max_part_bytes": 5242880,
    }
    schedule = await created(api, auth, body, "k-1")
    assert schedule["schedule_id"].startswith("sch_")
    assert {name: schedule[name] for name in ("conversation_id", "every", "start_at", "mode", "state")} == {
        "conversation_id": "c-a",
        "every": "PT6H",
        "start_at": "2024-05-01T08:00:00.000Z",
        "mode": "full",
        "state": "ACTIVE",
    }
    assert schedule["options"] == {
        "format": "csv",
        "after_seq": 7,
        "since": "2024-01-01T00:00:00.001Z",
        "senders": ["alice", "bob"],
        "compression": "gzip",
        "max_part_bytes": 5242880,
    }
    assert schedule["paused_reason"] is schedule["waiting_reason"] is schedule["last_run"] is None
    assert schedule["next_run_at"] == "2024-05-01T08:00:00.000Z"
    assert schedule["watermark"] == 7
    assert schedule["links"]["runs"] == f"{LIST}/{schedule['schedule_id']}/runs"
    assert await current(api, auth, schedule["schedule_id"]) == schedule

    # Defaults: anchored at the creation, incremental, the submit's options' defaults.
    before = datetime.now(UTC) - timedelta(seconds=5)
    plain = await created(api, auth, DAILY, "k-2")
    assert plain["mode"] == "incremental"
    assert plain["options"] == {
        "format": "jsonl",
        "after_seq": 0,
        "since": None,
        "senders": None,
        "compression": "none",
        "max_part_bytes": None,
    }
    assert before <= parse_timestamp(plain["start_at"]) == parse_timestamp(plain["next_run_at"])
    assert "Idempotent-Replayed" not in (await create(api, auth, DAILY, "k-3")).headers


async def test_the_callback_url_is_kept_but_never_shown(
    api: Client, auth: Auth, pool: asyncpg.Pool, members: None
) -> None:
    url = "https://hooks.example.com/schedules?secret=s3cr3t"
    response = await create(api, auth, {**DAILY, "notify": {"url": url}}, "k-1")
    assert response.status == 201, await response.text()
    assert "s3cr3t" not in await response.text()
    stored = await pool.fetchval("SELECT request->>'notify_url' FROM export_schedules")
    assert stored == url
    for bad in ("http://127.0.0.1/cb", "https://hooks.example.com/a\x00b"):
        refused = await create(api, auth, {**DAILY, "notify": {"url": bad}}, "k-2")
        body = await expect_problem(refused, 422, "NOTIFY_URL_REFUSED", case=bad)
        assert body["errors"][0]["loc"] == ["body", "notify", "url"]


async def test_a_replay_answers_201_with_the_schedule_as_it_is_now(
    api: Client, auth: Auth, pool: asyncpg.Pool, members: None
) -> None:
    first = await created(api, auth, {"every": "P1D", "format": "csv"}, "k-1")
    paused = await call(api, auth, "POST", f"{first['links']['self']}/pause")
    assert paused.status == 200
    # The same request in another spelling: the interval's letter case and the defaults written out.
    again = await create(api, auth, {"every": "p1d", "format": "csv", "mode": "incremental", "after_seq": 0}, "k-1")
    assert again.status == 201, await again.text()
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.headers["Location"] == first["links"]["self"]
    assert (await again.json())["state"] == "PAUSED"

    for different in ({"every": "P2D", "format": "csv"}, {"every": "P1D"}, {**DAILY, "mode": "full"}):
        response = await create(api, auth, different, "k-1")
        await expect_problem(response, 409, "IDEMPOTENCY_KEY_REUSED", case=different)
    # Another user's identical key is another key.
    assert (await create(api, auth, {"every": "P1D", "format": "csv"}, "k-1", user="bob")).status == 201

    await pool.execute("UPDATE idempotency_keys SET created_at = created_at - interval '400 days'")
    expired = await create(api, auth, {"every": "P1D", "format": "csv"}, "k-1")
    await expect_problem(expired, 409, "IDEMPOTENCY_KEY_EXPIRED")
    assert await pool.fetchval("SELECT count(*) FROM export_schedules") == 2


async def test_submits_and_schedules_share_one_key_space(
    api: Client, auth: Auth, pool: asyncpg.Pool, members: None
) -> None:
    exported = await submit(api, auth, "alice", "c-a", {"format": "jsonl"}, "k-export")
    assert exported.status == 202, await exported.text()
    await expect_problem(await create(api, auth, DAILY, "k-export"), 409, "IDEMPOTENCY_KEY_REUSED")

    await created(api, auth, DAILY, "k-schedule")
    again = await submit(api, auth, "alice", "c-a", {"format": "jsonl"}, "k-schedule")
    await expect_problem(again, 409, "IDEMPOTENCY_KEY_REUSED")
    assert await pool.fetchval("SELECT count(*) FROM operations") == 1
    assert await pool.fetchval("SELECT count(*) FROM export_schedules") == 1


async def test_two_idempotency_key_fields_create_nothing(
    api: Client, auth: Auth, pool: asyncpg.Pool, members: None
) -> None:
    headers = CIMultiDict([*auth("alice").items(), ("Idempotency-Key", "k-1"), ("Idempotency-Key", "k-2")])
    response = await api.post(CREATE.format(cid="c-a"), json=DAILY, headers=headers)
    await expect_problem(response, 400, "IDEMPOTENCY_KEY_INVALID")
    assert await pool.fetchval("SELECT count(*) FROM export_schedules") == 0


async def test_a_user_has_at_most_the_limit_of_schedules(
    api: Client, auth: Auth, settings: Settings, members: None
) -> None:
    limit = settings.max_schedules_per_user
    ids = [(await created(api, auth, DAILY, f"k-{n}"))["schedule_id"] for n in range(limit)]
    over = await create(api, auth, DAILY, "k-over")
    body = await expect_problem(over, 409, "TOO_MANY_SCHEDULES")
    assert str(limit) in body["detail"]
    # A replay is no new schedule, and the limit is each user's own.
    assert (await create(api, auth, DAILY, "k-0")).status == 201
    assert (await create(api, auth, DAILY, "k-0", user="bob")).status == 201

    assert (await call(api, auth, "DELETE", f"{LIST}/{ids[0]}")).status == 204
    assert (await create(api, auth, DAILY, "k-over")).status == 201


async def test_strangers_and_non_members_get_the_same_404(
    api: Client, auth: Auth, pool: asyncpg.Pool, members: None
) -> None:
    # A U+0000 in the id cannot be stored: the same answer, without asking the database.
    for user, cid in (("alice", "c-other"), ("alice", "c-missing"), ("mallory", "c-a"), ("alice", "c-a%00")):
        response = await create(api, auth, DAILY, "k-1", user=user, cid=cid)
        await expect_problem(response, 404, "NOT_FOUND", case=(user, cid))
    assert await pool.fetchval("SELECT count(*) FROM export_schedules") == 0

    schedule = await created(api, auth, DAILY, "k-1")
    missing = await call(api, auth, "GET", f"{LIST}/{GUESSED_ID}")
    expected = await expect_problem(missing, 404, "NOT_FOUND")
    own = schedule["links"]["self"]
    for user, method, url in [
        # bob is a member of the conversation but not the owner; carol is not even a member.
        *((user, method, url) for user in ("bob", "carol") for method, url in _routes_of(own)),
        *(("alice", method, url) for method, url in _routes_of(f"{LIST}/{GUESSED_ID}")),
        *(("alice", method, url) for method, url in _routes_of(f"{LIST}/not.an.id")),
    ]:
        response = await call(api, auth, method, url, user=user)
        assert await expect_problem(response, 404, "NOT_FOUND", case=(user, method, url)) == expected
    assert await current(api, auth, schedule["schedule_id"]) == schedule
    listed = await (await call(api, auth, "GET", LIST, user="bob")).json()
    assert listed == {"schedules": [], "next_cursor": None}


def _routes_of(schedule_url: str) -> list[tuple[str, str]]:
    return [
        ("GET", schedule_url),
        ("GET", f"{schedule_url}/runs"),
        ("POST", f"{schedule_url}/pause"),
        ("POST", f"{schedule_url}/resume"),
        ("DELETE", schedule_url),
    ]


NOT_INTERVALS = ["P", "PT", "P0D", "PT0S", "1D", "P1.5D", "PT1H30", "P1DT", "P-1D", "every day", "P1001Y", "P1H"]


async def test_bad_intervals_are_422_with_their_codes(
    api: Client, auth: Auth, settings: Settings, pool: asyncpg.Pool, members: None
) -> None:
    for every in NOT_INTERVALS:
        response = await create(api, auth, {"every": every}, "k-1")
        body = await expect_problem(response, 422, "SCHEDULE_INTERVAL_INVALID", case=every)
        assert [error["loc"] for error in body["errors"]] == [["body", "every"]], every
        # A problem never echoes the input.
        assert len(every) < 4 or every not in json.dumps(body), body
    assert settings.schedule_min_interval_seconds == 3600
    for every in ("PT59M59S", "PT3599S", "PT1S"):
        response = await create(api, auth, {"every": every}, "k-1")
        body = await expect_problem(response, 422, "SCHEDULE_INTERVAL_TOO_SHORT", case=every)
        assert "3600" in body["detail"]
    for body in ({}, {"every": ""}, {"every": 86400}, {"every": "P" + "1" * 64 + "D"}):
        await expect_problem(await create(api, auth, body, "k-1"), 422, "VALIDATION_FAILED", case=body)
    assert await pool.fetchval("SELECT count(*) FROM export_schedules") == 0
    # The minimum itself, and a month, which counts as its shortest (28 days).
    for n, every in enumerate(("PT1H", "PT3600S", "PT60M", "P1M", "P1W", "P1Y2M10DT2H30M")):
        assert (await created(api, auth, {"every": every}, f"k-ok-{n}"))["every"] == every


# Bodies a submit refuses as VALIDATION_FAILED; a schedule with the same options must refuse them alike.
BAD_OPTIONS: list[dict[str, Any]] = [
    {"format": "xml"},
    {"format": None},
    {"after_seq": -1},
    {"after_seq": "0"},
    {"after_seq": 2**63},
    {"since": "2026-03-08T01:30:00"},
    {"senders": []},
    {"senders": ["a" * 65]},
    {"compression": "zip"},
    {"max_part_bytes": 5242879},
    {"notify": {"url": ""}},
    {"parts": 2},
]


async def test_refused_options_are_422_and_the_others_validate_as_a_submits(
    api: Client, auth: Auth, pool: asyncpg.Pool, members: None
) -> None:
    for options, refused in (
        ({"before_seq": 5}, ["before_seq"]),
        ({"until": "2030-01-01T00:00:00Z"}, ["until"]),
        ({"until": "not even a time", "before_seq": 9}, ["before_seq", "until"]),
    ):
        response = await create(api, auth, {**DAILY, **options}, "k-1")
        body = await expect_problem(response, 422, "SCHEDULE_OPTION_REFUSED", case=options)
        assert [error["loc"] for error in body["errors"]] == [["body", name] for name in refused]
    for options in BAD_OPTIONS:
        scheduled = await expect_problem(await create(api, auth, {**DAILY, **options}, "k-1"), 422, "VALIDATION_FAILED")
        submitted = await expect_problem(
            await submit(api, auth, "alice", "c-a", options, "k-1"), 422, "VALIDATION_FAILED"
        )
        assert scheduled["errors"] == submitted["errors"], options
    assert await pool.fetchval("SELECT count(*) FROM export_schedules") == 0
    # null is absent, as in a submit.
    assert (await created(api, auth, {**DAILY, "before_seq": None, "until": None}, "k-2"))["state"] == "ACTIVE"


async def test_checks_run_in_the_submits_order(api: Client, auth: Auth, pool: asyncpg.Pool, members: None) -> None:
    bad = {"every": "P0D", "before_seq": 5}
    no_key = await api.post(CREATE.format(cid="c-other"), json=bad, headers=auth("alice"))
    await expect_problem(no_key, 400, "IDEMPOTENCY_KEY_MISSING")
    # The body before membership: a stranger learns nothing from a 422 but that the body is bad.
    await expect_problem(await create(api, auth, bad, "k-1", cid="c-other"), 422, "SCHEDULE_OPTION_REFUSED")
    await expect_problem(await create(api, auth, {"every": "P0D", "format": "x"}, "k-1"), 422, "VALIDATION_FAILED")
    interval_first = {"every": "P0D", "notify": {"url": "http://127.0.0.1/cb"}}
    await expect_problem(await create(api, auth, interval_first, "k-1"), 422, "SCHEDULE_INTERVAL_INVALID")
    short_first = {"every": "PT1M", "notify": {"url": "http://127.0.0.1/cb"}}
    await expect_problem(await create(api, auth, short_first, "k-1"), 422, "SCHEDULE_INTERVAL_TOO_SHORT")
    # Membership before the key: a key alice used is no 409 on a conversation she may not see.
    await created(api, auth, DAILY, "k-used")
    await expect_problem(await create(api, auth, {"every": "P2D"}, "k-used", cid="c-other"), 404, "NOT_FOUND")
    assert await pool.fetchval("SELECT count(*) FROM export_schedules") == 1


async def test_pause_and_resume_are_idempotent_and_resume_waits_for_the_next_due_time(
    api: Client, auth: Auth, members: None
) -> None:
    anchor = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=90)
    schedule = await created(api, auth, {"every": "PT1H", "start_at": format_timestamp(anchor)}, "k-1")
    url = schedule["links"]["self"]
    bodies: list[dict[str, Any] | None] = [None, {}]
    for body in bodies:
        response = await call(api, auth, "POST", f"{url}/pause", json=body)
        assert response.status == 200, await response.text()
        paused = await response.json()
        Schedule.model_validate(paused)
        assert (paused["state"], paused["paused_reason"], paused["next_run_at"]) == ("PAUSED", "USER", None)
    bad_body = await call(api, auth, "POST", f"{url}/resume", json={"now": True})
    await expect_problem(bad_body, 422, "VALIDATION_FAILED")

    for _ in range(2):
        response = await call(api, auth, "POST", f"{url}/resume")
        assert response.status == 200, await response.text()
        resumed = await response.json()
        assert (resumed["state"], resumed["paused_reason"]) == ("ACTIVE", None)
        # Due at -90 and -30 minutes, missed while paused: the next is at +30 minutes, not now.
        assert resumed["next_run_at"] == format_timestamp(anchor + timedelta(hours=2))
    assert resumed["updated_at"] == (await current(api, auth, schedule["schedule_id"]))["updated_at"]


async def test_resume_is_refused_while_a_run_needs_repair_or_the_owner_left(
    api: Client, auth: Auth, pool: asyncpg.Pool, members: None
) -> None:
    schedule = await created(api, auth, DAILY, "k-1")
    url, schedule_id = schedule["links"]["self"], schedule["schedule_id"]
    run_id = await _fire(pool, schedule_id)
    await pool.execute("UPDATE operations SET state = 'FAILED_REPAIR' WHERE operation_id = $1", run_id)
    parked = await current(api, auth, schedule_id)
    assert (parked["state"], parked["paused_reason"]) == ("PAUSED", "RUN_NEEDS_REPAIR")
    await expect_problem(await call(api, auth, "POST", f"{url}/resume"), 422, "SCHEDULE_NEEDS_REPAIR")
    # An operator's requeue of the run resumes the schedule.
    requeued = await api.post(f"/admin/operations/{run_id}/requeue", headers=auth("root", admin=True))
    assert requeued.status == 202, await requeued.text()
    assert (await current(api, auth, schedule_id))["state"] == "ACTIVE"
    assert (await (await call(api, auth, "POST", f"{url}/pause")).json())["paused_reason"] == "USER"

    response = await api.delete("/admin/conversations/c-a/members/alice", headers=auth("root", admin=True))
    assert response.status == 204
    await expect_problem(await call(api, auth, "POST", f"{url}/resume"), 403, "ACCESS_REVOKED")
    assert (await current(api, auth, schedule_id))["state"] == "PAUSED"
    response = await api.put("/admin/conversations/c-a/members/alice", headers=auth("root", admin=True))
    assert response.status == 204
    assert (await (await call(api, auth, "POST", f"{url}/resume")).json())["state"] == "ACTIVE"


async def _fire(pool: asyncpg.Pool, schedule_id: str) -> str:
    """Create the schedule's due run as the scheduler does; its operation id."""
    async with pool.acquire() as conn:
        fired = await schedule_runs.fire(conn, schedule_id=schedule_id, operation_id=new_operation_id(), max_active=5)
    assert fired.outcome is FireOutcome.CREATED, fired
    assert fired.operation_id is not None
    return fired.operation_id


async def test_a_run_is_an_operation_that_names_its_schedule(
    api: Client, auth: Auth, pool: asyncpg.Pool, members: None
) -> None:
    schedule = await created(api, auth, DAILY, "k-1")
    run_id = await _fire(pool, schedule["schedule_id"])
    operation = await (await call(api, auth, "GET", f"/v3/operations/{run_id}")).json()
    Operation.model_validate(operation)
    assert operation["schedule_id"] == schedule["schedule_id"]
    assert operation["due_at"] == schedule["start_at"]
    shown = await current(api, auth, schedule["schedule_id"])
    assert shown["last_run"] == {"operation_id": run_id, "due_at": schedule["start_at"], "state": "QUEUED"}
    submitted = await submit(api, auth, "alice", "c-a", {}, "k-export")
    assert (await submitted.json())["schedule_id"] is (await submitted.json())["due_at"] is None


async def test_delete_leaves_the_runs_and_frees_the_key(
    api: Client, auth: Auth, pool: asyncpg.Pool, members: None
) -> None:
    schedule = await created(api, auth, DAILY, "k-1")
    url = schedule["links"]["self"]
    run_id = await _fire(pool, schedule["schedule_id"])
    response = await call(api, auth, "DELETE", url)
    assert response.status == 204
    assert await response.read() == b""
    for method, route in _routes_of(url):
        await expect_problem(await call(api, auth, method, route), 404, "NOT_FOUND", case=(method, route))
    run = await call(api, auth, "GET", f"/v3/operations/{run_id}")
    assert (await run.json())["schedule_id"] == schedule["schedule_id"]
    # The key went with the schedule: the same request creates a new one.
    again = await create(api, auth, DAILY, "k-1")
    assert again.status == 201
    assert "Idempotent-Replayed" not in again.headers
    assert again.headers["Location"] != url


async def _pages(api: Client, auth: Auth, url: str, key: str, *, limit: int) -> list[list[dict[str, Any]]]:
    """Every page of the list at ``url``, ``limit`` items each, following ``next_cursor``."""
    pages: list[list[dict[str, Any]]] = []
    params: dict[str, Any] = {"limit": limit}
    while True:
        response = await call(api, auth, "GET", url, params=params)
        assert response.status == 200, await response.text()
        assert response.headers["Cache-Control"] == "no-store"
        page = await response.json()
        pages.append(page[key])
        if page["next_cursor"] is None:
            return pages
        params["cursor"] = page["next_cursor"]


async def test_the_list_pages_the_callers_schedules_newest_first(api: Client, auth: Auth, members: None) -> None:
    ids = [(await created(api, auth, DAILY, f"k-{n}"))["schedule_id"] for n in range(5)]
    await created(api, auth, DAILY, "k-bob", user="bob")
    pages = await _pages(api, auth, LIST, "schedules", limit=2)
    assert [len(page) for page in pages] == [2, 2, 1]
    listed = [schedule for page in pages for schedule in page]
    assert [schedule["schedule_id"] for schedule in listed] == ids[::-1]
    for schedule in listed:
        Schedule.model_validate(schedule)
    assert listed[0] == await current(api, auth, ids[-1])
    whole = await (await call(api, auth, "GET", LIST)).json()
    assert [schedule["schedule_id"] for schedule in whole["schedules"]] == ids[::-1]

    for params in ({"cursor": "nope"}, {"cursor": "W10"}, {"limit": "0"}, {"limit": "101"}, {"x": "1"}):
        response = await call(api, auth, "GET", LIST, params=params)
        await expect_problem(response, 422, "VALIDATION_FAILED", case=params)
    body = await expect_problem(await call(api, auth, "GET", LIST, params={"cursor": "nope"}), 422, "VALIDATION_FAILED")
    assert body["errors"][0]["loc"] == ["query", "cursor"]


async def test_runs_are_listed_newest_due_time_first(
    api: Client, auth: Auth, pool: asyncpg.Pool, members: None
) -> None:
    schedule = await created(api, auth, DAILY, "k-1")
    other = await created(api, auth, DAILY, "k-2")
    schedule_id = schedule["schedule_id"]
    start = parse_timestamp(schedule["start_at"])
    # Runs as the scheduler leaves them, created in another order than their due times.
    due = {f"op_run{n}": start + timedelta(days=k) for n, k in enumerate((3, 0, 4, 1, 2))}
    for operation_id, due_at in due.items():
        await insert_operation(pool, operation_id, "CANCELED", schedule_id=schedule_id, due_at=due_at)
    await insert_operation(pool, "op_other", "CANCELED", schedule_id=other["schedule_id"], due_at=start)
    await insert_operation(pool, "op_by_hand", "CANCELED")

    url = schedule["links"]["runs"]
    pages = await _pages(api, auth, url, "operations", limit=2)
    assert [len(page) for page in pages] == [2, 2, 1]
    runs = [run for page in pages for run in page]
    assert [run["operation_id"] for run in runs] == sorted(due, key=due.__getitem__, reverse=True)
    for run in runs:
        Operation.model_validate(run)
        assert run["schedule_id"] == schedule_id
        assert parse_timestamp(run["due_at"]) == due[run["operation_id"]]
    await expect_problem(await call(api, auth, "GET", url, params={"cursor": "x"}), 422, "VALIDATION_FAILED")
    empty = await call(api, auth, "GET", f"{LIST}/{other['schedule_id']}/runs", params={"limit": "1"})
    assert [run["operation_id"] for run in (await empty.json())["operations"]] == ["op_other"]


async def test_a_body_with_a_content_coding_or_another_media_type_is_415(
    api: Client, auth: Auth, pool: asyncpg.Pool, members: None
) -> None:
    raw = json.dumps(DAILY).encode()
    headers = {**auth("alice"), "Idempotency-Key": "k-1"}
    for data, extra, code in (
        (
            gzip.compress(raw),
            {"Content-Type": "application/json", "Content-Encoding": "gzip"},
            "UNSUPPORTED_CONTENT_ENCODING",
        ),
        (raw, {"Content-Type": "text/plain"}, "UNSUPPORTED_MEDIA_TYPE"),
    ):
        response = await api.post(CREATE.format(cid="c-a"), data=data, headers={**headers, **extra})
        await expect_problem(response, 415, code)
    assert await pool.fetchval("SELECT count(*) FROM export_schedules") == 0


@pytest.mark.parametrize("removal", ["member", "member set"])
async def test_removing_the_owner_pauses_the_schedule_at_once_with_its_callback(
    api: Client, auth: Auth, pool: asyncpg.Pool, members: None, removal: str
) -> None:
    """docs/schedules.md: When a run cannot go on. The pause is in the removal's transaction, not at the next
    due time; bob's schedule on the same conversation, and alice's on another, stay ACTIVE.
    """
    notify = {"notify": {"url": "https://hooks.example.com/schedules"}}
    await make_conversation(api, auth, "c-alice", ["alice"])
    revoked = await created(api, auth, {**DAILY, **notify}, "k-alice")
    kept = await created(api, auth, {**DAILY, **notify}, "k-bob", user="bob")
    response = await api.post(
        CREATE.format(cid="c-alice"), json=DAILY, headers={**auth("alice"), "Idempotency-Key": "k-elsewhere"}
    )
    assert response.status == 201, await response.text()
    elsewhere = await response.json()

    admin = auth("root", admin=True)
    if removal == "member":
        response = await api.delete("/admin/conversations/c-a/members/alice", headers=admin)
    else:
        response = await api.put("/admin/conversations/c-a", json={"members": ["bob"]}, headers=admin)
    assert response.status == 204, await response.text()

    paused = await current(api, auth, revoked["schedule_id"])
    assert (paused["state"], paused["paused_reason"], paused["next_run_at"]) == ("PAUSED", "ACCESS_REVOKED", None)
    assert (await current(api, auth, kept["schedule_id"], user="bob"))["state"] == "ACTIVE"
    assert (await current(api, auth, elsewhere["schedule_id"]))["state"] == "ACTIVE"
    callbacks = await pool.fetch("SELECT schedule_id, event_type FROM webhook_deliveries")
    assert [tuple(row) for row in callbacks] == [(revoked["schedule_id"], "schedule.paused")]
