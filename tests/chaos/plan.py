"""What one round of the fault harness does, drawn from its seed: the exports and schedules it asks for and the
faults it injects, with their moments. The same ``(seed, round)`` always gives the same plan, so a failing round can
be replayed (docs/development.md: Development, The fault harness); what the processes interleave may still differ.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

# Every round's workload and faults start within this many seconds of the round's start.
ROUND_WINDOW_SECONDS = 4.0
# A schedule of the round is created in the first half of the round's window, and runs 2.5 s to this long (a
# few due times) before it is paused for good: about as long as the round's exports take.
SCHEDULE_RUN_SECONDS = 4.5
PARTS = ("api", "relay", "worker-1", "worker-2", "janitor")
WORKERS = ("worker-1", "worker-2")
# Restarts of the broker or the database cost seconds each: a minority of rounds get one.
SERVER_RESTART_SHARE = 0.08
# In cluster mode a server fault instead: a broker node killed, a failover or replay paused on a standby
# (docs/development.md: The fault harness, Cluster mode). Each costs seconds too (a failover rebuilds a
# standby): a third of the rounds get one of the three.
CLUSTER_FAULT_SHARE = 0.33
BROKER_NODES = 3


class FaultKind(StrEnum):
    """The faults the harness injects (docs/development.md: Development, The fault harness)."""

    KILL = "kill"  # SIGKILL a part, start it again later
    TERM = "term"  # SIGTERM a part (it drains), start it again once it has exited
    STOP = "stop"  # SIGSTOP a part past the lease, then SIGCONT
    RESTART_BROKER = "restart_broker"
    RESTART_DATABASE = "restart_database"
    S3_CUT = "s3_cut"
    S3_SLOW = "s3_slow"
    S3_ERRORS = "s3_errors"
    JANITOR_LOCK_LOST = "janitor_lock_lost"  # pg_terminate_backend of the leader's lock session
    CLOCK_SHIFT = "clock_shift"  # a worker restarted with its wall clock moved (libfaketime)
    BAD_WAKEUP = "bad_wakeup"  # a message on the queue that cannot be decoded
    RELAY_KILLED_BEFORE_COMMIT = "relay_killed_before_commit"
    RECEIVER_DOWN = "receiver_down"
    RECEIVER_SLOW = "receiver_slow"
    RECEIVER_ERRORS = "receiver_errors"
    # Cluster mode only, instead of the restarts above:
    KILL_BROKER_NODE = "kill_broker_node"  # SIGKILL one RabbitMQ node of three, start it again later
    DATABASE_FAILOVER = "database_failover"  # the primary killed, a standby promoted, the old one rebuilt
    REPLAY_PAUSED = "replay_paused"  # WAL replay paused on the standby the worker reads on


# Faults that act on one process name.
PART_FAULTS = {FaultKind.KILL, FaultKind.TERM, FaultKind.STOP}
SERVER_RESTARTS = {FaultKind.RESTART_BROKER, FaultKind.RESTART_DATABASE}
CLUSTER_FAULTS = {FaultKind.KILL_BROKER_NODE, FaultKind.DATABASE_FAILOVER, FaultKind.REPLAY_PAUSED}


@dataclass(frozen=True)
class Fault:
    """One fault: ``kind`` at ``at_seconds`` after the round's start, lasting ``for_seconds``; ``target`` is
    the part it acts on (``PARTS``) or empty; ``detail`` a kind-specific choice (a stop mode, a clock shift
    in seconds, a rate in bytes per second).
    """

    kind: FaultKind
    at_seconds: float
    for_seconds: float
    target: str = ""
    detail: str = ""


@dataclass(frozen=True)
class ExportSpec:
    """One export of the round's workload.

    ``conversation`` is ``"big"`` (the run's large conversation) or the index of one of the round's own;
    ``options`` the request body; ``user`` the member who asks; ``duplicates`` how many more times the same
    request is sent with the same key; ``cancel_after`` seconds after the submit to cancel it, or None;
    ``recalls`` how many of the conversation's messages its sender recalls during the export;
    ``drop_member`` whether the user loses membership during the export; ``download``: ``"full"``,
    ``"aborted"`` (closed part-way, then resumed with ``Range``) or ``""``; ``live_messages`` how many
    messages members send to the conversation while it runs (the watermark decides which are in).
    """

    conversation: str
    user: str
    at_seconds: float
    options: dict[str, Any]
    duplicates: int
    cancel_after: float | None
    recalls: int
    drop_member: bool
    download: str
    live_messages: int = 0


@dataclass(frozen=True)
class ScheduleSpec:
    """One incremental export schedule of the round's workload, on a conversation of its own
    (docs/schedules.md: The chain).

    ``every`` is its interval (``PT1S`` or ``PT2S``: the test-only minimum and twice it); ``size`` the messages
    its conversation starts with; ``options`` the rest of the body (export options, ``notify``); it is created at
    ``at_seconds`` by ``user`` (sent ``duplicates`` more times with the same key) and paused for good
    ``runs_for`` seconds later. Meanwhile members send ``live_messages`` messages, evenly spread, and recall
    ``recalls`` of the conversation's messages (imported or sent); ``pause_at`` seconds after its creation the
    owner pauses it and resumes it ``pause_for`` seconds later, or never when None.
    """

    every: str
    user: str
    at_seconds: float
    size: int
    options: dict[str, Any]
    duplicates: int
    runs_for: float
    live_messages: int
    recalls: int
    pause_at: float | None
    pause_for: float


@dataclass(frozen=True)
class RoundPlan:
    """A round: its conversations' sizes (messages), its exports, its schedules and its faults."""

    seed: int
    round_number: int
    conversation_sizes: list[int] = field(default_factory=list)
    exports: list[ExportSpec] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    schedules: list[ScheduleSpec] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """The plan as JSON-ready data, for the round's log."""
        return asdict(self)


def plan_round(seed: int, round_number: int, *, cluster: bool = False) -> RoundPlan:
    """The plan of round ``round_number`` (1-based) of a run with ``seed``; deterministic for each
    ``(seed, round_number, cluster)``. With ``cluster`` the round's server fault, if any, is one of
    ``CLUSTER_FAULTS`` instead of a restart; the rest of the plan is the same in both modes.
    """
    rng = random.Random(f"chatexport-chaos:{seed}:{round_number}")
    sizes = [rng.choice([0, 1, 7, 30, 120]) for _ in range(rng.randint(1, 2))]
    exports = [_export(rng, len(sizes)) for _ in range(rng.randint(2, 5))]
    faults = [_fault(rng) for _ in range(rng.choice([1, 1, 2, 2, 3]))]
    draw = rng.random()
    if cluster and draw < CLUSTER_FAULT_SHARE:
        faults.append(_cluster_fault(rng))
    elif not cluster and draw < SERVER_RESTART_SHARE:
        faults.append(_server_restart(rng))
    faults.sort(key=lambda fault: fault.at_seconds)
    return RoundPlan(seed, round_number, sizes, exports, faults, _schedules(seed, round_number))


def _schedules(seed: int, round_number: int) -> list[ScheduleSpec]:
    """Two or three schedules, the first of them paused and resumed while it runs. Drawn from a generator of
    their own, so that a seed's exports and faults are those it planned before schedules were in the workload.
    """
    rng = random.Random(f"chatexport-chaos-schedules:{seed}:{round_number}")
    return [_schedule(rng, paused=number == 0) for number in range(rng.choice([2, 2, 3]))]


def _schedule(rng: random.Random, *, paused: bool) -> ScheduleSpec:
    options: dict[str, Any] = {"format": rng.choice(["jsonl", "jsonl", "csv", "html"])}
    if rng.random() < 0.3:
        options["compression"] = "gzip"
    if rng.random() < 0.2:
        options["after_seq"] = rng.randint(0, 5)
    if rng.random() < 0.3:
        options["senders"] = [rng.choice(["alice", "bob"])]
    if rng.random() < 0.15:
        options["since"] = "2026-01-01T00:00:00+02:00"
    if rng.random() < 0.4:
        options["notify"] = {"url": "RECEIVER"}  # the harness puts its receiver's URL here
    runs_for = round(rng.uniform(2.5, SCHEDULE_RUN_SECONDS), 2)
    return ScheduleSpec(
        every=rng.choice(["PT1S", "PT1S", "PT2S"]),
        user=rng.choice(["alice", "bob"]),
        at_seconds=round(rng.uniform(0, ROUND_WINDOW_SECONDS / 2), 2),
        size=rng.choice([0, 7, 30]),
        options=options,
        duplicates=rng.choice([0, 0, 1]),
        runs_for=runs_for,
        live_messages=rng.choice([2, 5, 8]),
        recalls=rng.choice([0, 1, 3]),
        pause_at=round(rng.uniform(0.5, runs_for / 2), 2) if paused else None,
        pause_for=round(rng.uniform(0.5, 2.0), 2),
    )


def _export(rng: random.Random, conversations: int) -> ExportSpec:
    big = rng.random() < 0.2
    return ExportSpec(
        conversation="big" if big else str(rng.randrange(conversations)),
        user=rng.choice(["alice", "bob"]),
        at_seconds=round(rng.uniform(0, ROUND_WINDOW_SECONDS), 2),
        options=_options(rng, big),
        duplicates=rng.choice([0, 0, 1, 2]),
        cancel_after=round(rng.uniform(0, 2), 2) if rng.random() < 0.2 else None,
        recalls=rng.choice([0, 0, 1, 3]),
        drop_member=rng.random() < 0.1,
        download=rng.choice(["", "full", "full", "aborted"]),
        live_messages=rng.choice([0, 0, 2, 5]),
    )


def _options(rng: random.Random, big: bool) -> dict[str, Any]:
    """A request body that uses each export option now and then (docs/api.md: Submitting an export, Export options)."""
    options: dict[str, Any] = {"format": rng.choice(["jsonl", "jsonl", "csv", "html"])}
    if rng.random() < 0.3:
        options["compression"] = "gzip"
    if rng.random() < 0.2:
        options["after_seq"] = rng.randint(0, 20)
    if rng.random() < 0.2:
        options["before_seq"] = options.get("after_seq", 0) + rng.randint(2, 60)  # at least one message
    if rng.random() < 0.2:
        options["senders"] = [rng.choice(["alice", "bob"])]
    if rng.random() < 0.15:
        options["since"] = "2026-01-01T00:00:00+02:00"
        options["until"] = rng.choice(["2026-01-01T00:00:30Z", "2030-01-01T00:00:00-05:00"])
    if big and rng.random() < 0.5:
        options["max_part_bytes"] = 5 * 1024 * 1024
    if rng.random() < 0.4:
        options["notify"] = {"url": "RECEIVER"}  # the harness puts its receiver's URL here
    return options


def _fault(rng: random.Random) -> Fault:
    kind = rng.choice([kind for kind in FaultKind if kind not in SERVER_RESTARTS | CLUSTER_FAULTS])
    at = round(rng.uniform(0, ROUND_WINDOW_SECONDS), 2)
    duration = round(rng.uniform(0.5, 3.0), 2)
    if kind in PART_FAULTS:
        return Fault(kind, at, duration, target=rng.choice(PARTS))
    if kind is FaultKind.CLOCK_SHIFT:
        return Fault(kind, at, duration, target=rng.choice(WORKERS), detail=str(rng.choice([-1, 1]) * 600))
    if kind is FaultKind.S3_SLOW:
        return Fault(kind, at, duration, detail=str(rng.choice([64 * 1024, 512 * 1024])))
    return Fault(kind, at, duration)


def _server_restart(rng: random.Random) -> Fault:
    kind = rng.choice(sorted(SERVER_RESTARTS))
    modes = ["fast", "immediate"] if kind is FaultKind.RESTART_DATABASE else ["graceful", "kill"]
    return Fault(kind, round(rng.uniform(0, ROUND_WINDOW_SECONDS), 2), 1.0, detail=rng.choice(modes))


def _cluster_fault(rng: random.Random) -> Fault:
    """A broker node (``detail``: its number, from 1) down 1 to 4 s; the old primary down 0.5 to 2 s before
    it is rebuilt as a standby; or replay paused 1 to 5 s, so past the worker's wait for the standby.
    """
    kind = rng.choice(sorted(CLUSTER_FAULTS))
    at = round(rng.uniform(0, ROUND_WINDOW_SECONDS), 2)
    if kind is FaultKind.KILL_BROKER_NODE:
        return Fault(kind, at, round(rng.uniform(1.0, 4.0), 2), detail=str(rng.randint(1, BROKER_NODES)))
    if kind is FaultKind.DATABASE_FAILOVER:
        return Fault(kind, at, round(rng.uniform(0.5, 2.0), 2))
    return Fault(kind, at, round(rng.uniform(1.0, 5.0), 2))
