"""An incremental schedule's chain as the tests judge it (docs/schedules.md: The chain): the runs that moved its
watermark, and whether their files together hold every selected message of the chain's range exactly once, in
order. The end-to-end tests read the files over HTTP and the fault harness's checker reads them from S3; both
judge them here, against the messages and the runs' times as Postgres holds them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import asyncpg

# The messages an operation's file may hold: its range, its watermark and its filters, not recalled before it
# began. Those recalled after it ended must be in it (``required``); those recalled between may be either.
SELECTED_SQL = """
SELECT m.seq, m.body, (m.recalled_at IS NULL OR m.recalled_at > o.finished_at) AS required
FROM operations o JOIN messages m ON m.conversation_id = o.conversation_id
WHERE o.operation_id = $1 AND m.seq > o.after_seq AND m.seq <= o.snapshot_max_seq
  AND (o.before_seq IS NULL OR m.seq < o.before_seq)
  AND (o.since IS NULL OR m.sent_at >= o.since) AND (o.until IS NULL OR m.sent_at < o.until)
  AND (o.senders IS NULL OR m.sender_id = ANY (o.senders))
  AND (m.recalled_at IS NULL OR m.recalled_at >= o.created_at) AND m.sent_at <= o.finished_at
"""
RUNS_SQL = """
SELECT operation_id, state, after_seq, snapshot_max_seq, due_at, created_at, finished_at
FROM operations WHERE schedule_id = $1 ORDER BY due_at
"""


@dataclass(frozen=True)
class Run:
    """One run as Postgres holds it: ``after_seq`` where it started, ``snapshot_max_seq`` where it read up to
    (None before its first claim).
    """

    operation_id: str
    state: str
    after_seq: int
    snapshot_max_seq: int | None


async def read_runs(conn: asyncpg.Connection, schedule_id: str) -> list[Run]:
    """The schedule's runs, by due time."""
    rows = await conn.fetch(RUNS_SQL, schedule_id)
    return [Run(row["operation_id"], row["state"], row["after_seq"], row["snapshot_max_seq"]) for row in rows]


def links(runs: Sequence[Run], start: int) -> list[Run]:
    """The runs of ``runs`` (by due time) that moved the watermark from ``start``: each SUCCEEDED, and started
    at the snapshot of the one before (the first at ``start``).
    """
    chain: list[Run] = []
    watermark = start
    for run in runs:
        if run.state == "SUCCEEDED" and run.after_seq == watermark and run.snapshot_max_seq is not None:
            chain.append(run)
            watermark = run.snapshot_max_seq
    return chain


async def chain_findings(
    conn: asyncpg.Connection, schedule_id: str, *, start: int, watermark: int, files: Mapping[str, Sequence[int]]
) -> list[str]:
    """What breaks the chain guarantee of ``schedule_id``, whose runs have all ended, as sentences (none: it
    holds). ``start`` is where its chain began (its ``after_seq``), ``watermark`` the schedule's now, ``files``
    the seqs each SUCCEEDED run's files hold, in file order (parts one after another).

    The watermark must be the snapshot of the chain's last run; no SUCCEEDED run may be outside the chain
    (its file would overlap it); and the chain's files, one after another, must hold each message of the
    chain's range once, in seq order, every one that matched the options and was not recalled before its run
    ended, none that was recalled before its run began (``SELECTED_SQL``).
    """
    runs = await read_runs(conn, schedule_id)
    chain = links(runs, start)
    findings = []
    end = chain[-1].snapshot_max_seq if chain else start
    if watermark != end:
        findings.append(f"{schedule_id}: its watermark is {watermark}, but its chain ends at {end}")
    strays = [run.operation_id for run in runs if run.state == "SUCCEEDED" and run not in chain]
    if strays:
        findings.append(f"{schedule_id}: SUCCEEDED runs outside its chain: {strays}")
    seqs = [seq for run in chain for seq in files[run.operation_id]]
    if len(seqs) != len(set(seqs)):
        findings.append(f"{schedule_id}: a message is in its chain's files twice")
    if seqs != sorted(seqs):
        findings.append(f"{schedule_id}: its chain's files are not in seq order")
    selected: dict[int, bool] = {}
    for run in chain:
        selected |= {row["seq"]: row["required"] for row in await conn.fetch(SELECTED_SQL, run.operation_id)}
    outside = set(seqs) - set(selected)
    missing = {seq for seq, required in selected.items() if required} - set(seqs)
    if outside:
        findings.append(f"{schedule_id}: its chain's files hold messages outside its selection: {sorted(outside)[:10]}")
    if missing:
        findings.append(f"{schedule_id}: its chain's files miss messages never recalled: {sorted(missing)[:10]}")
    return findings
