"""Imports larger than one statement's chunk: seqs stay gapless and in line order, repeats are skipped."""

from __future__ import annotations

from typing import Any

from shared.repository.message_store import IMPORT_CHUNK_ROWS
from tests.support.api_calls import Headers, make_conversation, read_all


async def test_an_import_over_several_chunks_is_one_ordered_gapless_batch(api: Any, auth: Headers) -> None:
    await make_conversation(api, auth, "c-big", ["alice"])
    total = 2 * IMPORT_CHUNK_ROWS + 17
    ids = [f"m{n}" for n in range(total)]
    ids[IMPORT_CHUNK_ROWS + 3] = "m1"  # a repeat that lands in the second chunk
    body = "".join(f'{{"message_id":"{i}","sender_id":"alice","body":"b{n}"}}\n' for n, i in enumerate(ids))
    response = await api.post(
        "/admin/conversations/c-big/messages:import",
        data=body.encode(),
        headers={**auth("root", admin=True), "Content-Type": "application/x-ndjson"},
    )
    assert response.status == 200, await response.text()
    assert await response.json() == {"imported": total - 1, "skipped": 1}

    messages = await read_all(api, auth, "alice", "c-big")
    assert [m["seq"] for m in messages] == list(range(1, total))
    expected_ids = [i for n, i in enumerate(ids) if n != IMPORT_CHUNK_ROWS + 3]
    assert [m["message_id"] for m in messages] == expected_ids
    assert messages[1]["body"] == "b1"
