"""The demo corpus import on the real Postgres: idempotent, ordered, attributed, with members set."""

from __future__ import annotations

import itertools

import asyncpg

from devtools import corpus

SNAPSHOT = """
    SELECT conversation_id, seq, message_id, sender_id, body, sent_at, recalled_at
    FROM messages ORDER BY conversation_id, seq
"""


def chinese_conversations() -> list[corpus.CorpusConversation]:
    return [corpus.load_file(language, path) for language, path in corpus.corpus_files(["chinese"])]


async def test_importing_twice_stores_the_same_messages_once(pool: asyncpg.Pool) -> None:
    expected = chinese_conversations()
    total = sum(len(conversation.lines) for conversation in expected)

    first = await corpus.import_corpus(pool, languages=["chinese"])
    stored = await pool.fetch(SNAPSHOT)
    second = await corpus.import_corpus(pool, languages=["chinese"])

    assert (first.conversations, first.imported, first.skipped) == (len(expected), total, 0)
    assert (second.conversations, second.imported, second.skipped) == (len(expected), 0, total)
    assert await pool.fetch(SNAPSHOT) == stored
    assert len(stored) == total
    last_seqs = await pool.fetch("SELECT conversation_id, last_seq FROM conversations ORDER BY 1")
    assert {row["conversation_id"]: row["last_seq"] for row in last_seqs} == {
        conversation.conversation_id: len(conversation.lines) for conversation in expected
    }


async def test_a_conversation_keeps_dialog_order_with_alternating_senders(pool: asyncpg.Pool) -> None:
    await corpus.import_corpus(pool, languages=["chinese"])
    greetings = next(c for c in chinese_conversations() if c.conversation_id == "corpus-chinese-greetings")

    rows = await pool.fetch(
        "SELECT seq, message_id, sender_id, body, sent_at FROM messages WHERE conversation_id = $1 ORDER BY seq",
        "corpus-chinese-greetings",
    )

    assert [row["seq"] for row in rows] == list(range(1, len(greetings.lines) + 1))
    assert [(row["message_id"], row["body"]) for row in rows] == [
        (line.message_id, line.body) for line in greetings.lines
    ]
    assert rows[0]["message_id"] == "greetings-0-0" and rows[0]["body"] == "你好"
    senders = [row["sender_id"] for row in rows]
    assert senders[:4] == ["alice", "bob", "carol", "alice"]
    assert all(a != b for a, b in itertools.pairwise(senders))
    assert [row["sent_at"] for row in rows] == sorted(row["sent_at"] for row in rows)


async def test_members_are_set_and_a_changed_member_set_is_restored(pool: asyncpg.Pool) -> None:
    await corpus.import_corpus(pool, languages=["chinese"], limit_files=1)
    conversation_id = corpus.load_file(*corpus.corpus_files(["chinese"], limit_files=1)[0]).conversation_id
    members_sql = "SELECT user_id FROM conversation_members WHERE conversation_id = $1 ORDER BY user_id"
    assert [row["user_id"] for row in await pool.fetch(members_sql, conversation_id)] == ["alice", "bob", "carol"]

    await pool.execute("DELETE FROM conversation_members WHERE user_id = 'bob'")
    await pool.execute(
        "INSERT INTO conversation_members (conversation_id, user_id) VALUES ($1, 'mallory')", conversation_id
    )
    summary = await corpus.import_corpus(pool, languages=["chinese"], limit_files=1)

    assert summary.imported == 0
    assert [row["user_id"] for row in await pool.fetch(members_sql, conversation_id)] == ["alice", "bob", "carol"]


async def test_limit_files_imports_that_many_conversations_per_language(pool: asyncpg.Pool) -> None:
    summary = await corpus.import_corpus(pool, languages=["chinese", "english"], limit_files=2)
    ids = [row["conversation_id"] for row in await pool.fetch("SELECT conversation_id FROM conversations ORDER BY 1")]
    assert summary.conversations == 2 * 2 == len(ids)
    assert {conversation_id.split("-")[1] for conversation_id in ids} == {"chinese", "english"}
