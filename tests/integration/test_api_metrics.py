"""The API's metrics move with what it answers: HTTP requests by route template and status, idempotency
replays and conflicts, authorization refusals by stage, downloads by outcome.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY

from tests.helpers import Headers, make_conversation, submit

pytestmark = pytest.mark.integration


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_requests_are_counted_by_route_template_and_status(api: Any, auth: Headers) -> None:
    route = "/v3/operations/{operation_id}"
    found_before = sample("chatexport_http_requests_total", method="GET", route=route, status="404")
    unmatched_before = sample("chatexport_http_requests_total", method="GET", route="unmatched", status="404")
    timed_before = sample("chatexport_http_request_duration_seconds_count", method="GET", route=route, status="404")

    for unknown in ("op_a", "op_b"):
        assert (await api.get(f"/v3/operations/{unknown}", headers=auth("alice"))).status == 404
    assert (await api.get("/no/such/route")).status == 404

    assert sample("chatexport_http_requests_total", method="GET", route=route, status="404") == found_before + 2
    assert (
        sample("chatexport_http_request_duration_seconds_count", method="GET", route=route, status="404")
        == timed_before + 2
    )
    # Every unknown path shares one label, so scanners cannot grow the label set.
    assert sample("chatexport_http_requests_total", method="GET", route="unmatched", status="404") == (
        unmatched_before + 1
    )


async def test_idempotency_replays_and_conflicts_are_counted(api: Any, auth: Headers) -> None:
    await make_conversation(api, auth, "c-metrics", ["alice"])
    replays = sample("chatexport_idempotency_replays_total")
    reused = sample("chatexport_idempotency_conflicts_total", code="IDEMPOTENCY_KEY_REUSED")

    assert (await submit(api, auth, "alice", "c-metrics", {"format": "jsonl"}, "k-1")).status == 202
    assert (await submit(api, auth, "alice", "c-metrics", {"format": "jsonl"}, "k-1")).status == 202
    assert (await submit(api, auth, "alice", "c-metrics", {"format": "jsonl", "after_seq": 1}, "k-1")).status == 409

    assert sample("chatexport_idempotency_replays_total") == replays + 1
    assert sample("chatexport_idempotency_conflicts_total", code="IDEMPOTENCY_KEY_REUSED") == reused + 1


async def test_refusals_at_submit_and_download_are_counted_by_stage(
    api: Any, auth: Headers, pool: asyncpg.Pool
) -> None:
    await make_conversation(api, auth, "c-refused", ["alice"])
    submit_refusals = sample("chatexport_authorization_refusals_total", stage="submit")
    download_refusals = sample("chatexport_authorization_refusals_total", stage="download")
    expired = sample("chatexport_downloads_total", outcome="RESULT_EXPIRED")
    revoked = sample("chatexport_downloads_total", outcome="ACCESS_REVOKED")

    assert (await submit(api, auth, "mallory", "c-refused", {"format": "jsonl"}, "k-1")).status == 404
    response = await submit(api, auth, "alice", "c-refused", {"format": "jsonl"}, "k-2")
    operation_id = (await response.json())["operation_id"]
    # Ended states written directly: what the download answers depends only on them (README: Error codes).
    await pool.execute(
        "UPDATE operations SET state = 'SUCCEEDED', result_key = 'k', result_size_bytes = 0,"
        " result_sha256 = '', result_message_count = 0, result_expires_at = now() + interval '1 day'"
        " WHERE operation_id = $1",
        operation_id,
    )
    await pool.execute("DELETE FROM conversation_members WHERE conversation_id = 'c-refused'")
    assert (await api.get(f"/v3/exports/{operation_id}/result", headers=auth("alice"))).status == 403
    await pool.execute("UPDATE operations SET state = 'EXPIRED' WHERE operation_id = $1", operation_id)
    assert (await api.get(f"/v3/exports/{operation_id}/result", headers=auth("alice"))).status == 410

    assert sample("chatexport_authorization_refusals_total", stage="submit") == submit_refusals + 1
    assert sample("chatexport_authorization_refusals_total", stage="download") == download_refusals + 1
    assert sample("chatexport_downloads_total", outcome="ACCESS_REVOKED") == revoked + 1
    assert sample("chatexport_downloads_total", outcome="RESULT_EXPIRED") == expired + 1
