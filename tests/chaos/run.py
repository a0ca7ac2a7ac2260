"""Runs rounds of the fault harness and reports them (docs/development.md: Development, The fault harness).

``python -m tests.chaos --rounds N [--seed S] [--round K] [--out DIR] [--lanes L] [--cluster]``: N rounds
of a run with seed S (random when absent), or only round K of it, on L systems at once (each takes every
L-th round); with ``--cluster`` each system runs on a RabbitMQ cluster and a PostgreSQL primary with
standbys, and the server faults are the clusters' (docs/development.md: The fault harness, Cluster mode).
Each round prepares its conversations, drives its workload while its faults are injected, repairs everything,
runs the checker and deletes the round's schedules. ``rounds.jsonl`` in the output folder gets one line per round
(seed, round, faults, operations, schedules, runs, findings); a failing round's folder ``round-K`` keeps its plan,
its event log, the parts' logs of that round and the findings. A SIGTERM or Ctrl-C stops the run between or
inside rounds (the unfinished round counts nothing) and still writes ``summary.json``, with ``finished`` false.
Exit status 1 when any round found a violation, else 130 when the run was stopped early.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.chaos.faults import Injector
from tests.chaos.invariants import Checker, database_now, read_messages
from tests.chaos.plan import Fault, RoundPlan, plan_round
from tests.chaos.system import ChaosSystem, chaos_system
from tests.chaos.workload import RequestGivenUp, Workload


@dataclass
class Summary:
    """A run's figures: rounds, faults injected by kind, operations checked (and of them the schedules' runs),
    schedules, violations, wall time (s).
    """

    seed: int
    rounds: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    operations: int = 0
    schedules: int = 0
    runs: int = 0
    requests: int = 0
    downloads: int = 0
    violations: int = 0
    failed_rounds: list[int] = field(default_factory=list)
    seconds: float = 0.0
    finished: bool = False

    def as_json(self) -> dict[str, Any]:
        """The figures as JSON-ready data."""
        return {**self.__dict__, "faults": dict(sorted(self.faults.items())), "seconds": round(self.seconds, 1)}


async def run_chaos(
    rounds: Iterable[int], out_dir: Path, summary: Summary, *, lanes: int = 1, cluster: bool = False
) -> None:
    """Run ``rounds`` (round numbers) of the run with ``summary.seed`` on ``lanes`` systems started for it
    (on clusters with ``cluster``), each taking every ``lanes``-th round, at the same time; add their
    figures to ``summary`` and write their records under ``out_dir``. A round's outcome does not depend on
    its lane: each starts from a quiet system.
    ``summary.json`` is written also when the run is cancelled.
    """
    started = time.monotonic()
    planned = list(rounds)

    async def lane(number: int) -> None:
        folder = out_dir / ("system" if lanes == 1 else f"system-{number + 1}")
        async with chaos_system(folder, cluster=cluster) as system:
            await run_rounds(system, summary.seed, planned[number::lanes], out_dir, summary)

    try:
        await asyncio.gather(*(lane(number) for number in range(lanes)))
        summary.finished = True
    finally:
        summary.seconds = time.monotonic() - started
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "summary.json").write_text(json.dumps(summary.as_json(), indent=2) + "\n")


async def run_rounds(
    system: ChaosSystem, seed: int, rounds: Iterable[int], out_dir: Path, summary: Summary | None = None
) -> Summary:
    """Run ``rounds`` of the run with ``seed`` on ``system``, adding their figures to ``summary`` (a new one
    by default); return it. A system on clusters gets the cluster mode's plans.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summary or Summary(seed)
    started = time.monotonic()
    cluster = system.clusters is not None
    setup = Workload(system, plan_round(seed, 0, cluster=cluster), lambda _: None)
    try:
        await setup.prepare_big()
    finally:
        await setup.close()
    for round_number in rounds:
        await _round(system, plan_round(seed, round_number, cluster=cluster), out_dir, summary)
    summary.seconds = time.monotonic() - started
    return summary


async def _round(system: ChaosSystem, plan: RoundPlan, out_dir: Path, summary: Summary) -> None:
    started = time.monotonic()
    events: list[str] = []

    def log(text: str) -> None:
        events.append(f"{time.monotonic() - started:8.2f} {text}")

    offsets = _log_sizes(system.log_dir)
    workload = Workload(system, plan, log)
    injector = Injector(system, log)
    runs = 0
    try:
        try:
            findings, runs = await _play(system, plan, workload, injector, log, offsets)
        except Exception as error:  # the round could not be judged: a finding of its own, and the run goes on
            findings = [f"the harness could not finish the round: {error!r}"]
            await injector.heal()
        # Judged: the next rounds must not see the schedules fire (nor count them against a user's limit).
        try:
            await workload.delete_schedules()
        except RequestGivenUp as error:
            findings.append(f"the round's schedules could not be deleted: {error}")
    finally:
        await workload.close()
    summary.rounds += 1
    summary.faults.update(injector.injected)
    summary.operations += len(workload.seen.submitted) + runs
    summary.schedules += len(workload.seen.scheduled)
    summary.runs += runs
    summary.requests += workload.seen.requests
    summary.downloads += workload.seen.downloads
    summary.violations += len(findings)
    record = {
        "seed": plan.seed,
        "round": plan.round_number,
        "faults": [f"{fault.kind}@{fault.at_seconds}:{fault.target or fault.detail}" for fault in plan.faults],
        "operations": len(workload.seen.submitted) + runs,
        "schedules": len(workload.seen.scheduled),
        "runs": runs,
        "findings": findings,
        "seconds": round(time.monotonic() - started, 1),
    }
    with (out_dir / "rounds.jsonl").open("a") as rounds_log:
        rounds_log.write(json.dumps(record) + "\n")
    verdict = "ok" if not findings else f"{len(findings)} VIOLATION(S)"
    print(
        f"round {plan.round_number} (seed {plan.seed}): {verdict}, {record['seconds']} s, {record['faults']}",
        flush=True,
    )
    if findings:
        summary.failed_rounds.append(plan.round_number)
        folder = _keep_round(system, plan, out_dir, events, findings, offsets)
        replay = f"make chaos SEED={plan.seed} ROUND={plan.round_number}{' CLUSTER=1' if system.clusters else ''}"
        print(f"  findings and logs in {folder}; replay: {replay}", flush=True)


async def _play(
    system: ChaosSystem,
    plan: RoundPlan,
    workload: Workload,
    injector: Injector,
    log: Callable[[str], None],
    log_offsets: dict[Path, int],
) -> tuple[list[str], int]:
    """Prepare, run the workload under the plan's faults, repair, give memberships back, then check; return the
    findings and how many runs the round's schedules made.
    """
    await workload.prepare()
    before = await read_messages(system.database_url)
    started_at = await database_now(system.database_url)
    outcomes = await asyncio.gather(
        workload.run(), *(_scheduled(injector, fault) for fault in plan.faults), return_exceptions=True
    )
    findings = [str(outcome) for outcome in outcomes if isinstance(outcome, RequestGivenUp)]
    for outcome in outcomes:
        if isinstance(outcome, BaseException) and not isinstance(outcome, RequestGivenUp):
            raise outcome
    await injector.heal()
    await workload.restore()
    log("repaired everything; checking")
    checker = Checker(
        system,
        workload.seen,
        before,
        started_at=started_at,
        healed_at=injector.healed_at,
        windows=injector.windows,
        log_offsets=log_offsets,
    )
    findings += await checker.check()
    return findings, checker.runs


async def _scheduled(injector: Injector, fault: Fault) -> None:
    await asyncio.sleep(fault.at_seconds)  # the plan's moment for this fault
    await injector.inject(fault)


def _log_sizes(log_dir: Path) -> dict[Path, int]:
    return {path: path.stat().st_size for path in log_dir.glob("*.log")}


def _keep_round(
    system: ChaosSystem,
    plan: RoundPlan,
    out_dir: Path,
    events: list[str],
    findings: list[str],
    offsets: dict[Path, int],
) -> Path:
    """Write a failing round's plan, events, findings and the part logs it produced into ``round-K``."""
    folder = out_dir / f"round-{plan.round_number}"
    folder.mkdir(exist_ok=True)
    (folder / "plan.json").write_text(json.dumps(plan.as_json(), indent=2) + "\n")
    (folder / "events.log").write_text("\n".join(events) + "\n")
    (folder / "findings.json").write_text(json.dumps(findings, indent=2) + "\n")
    for path in system.log_dir.glob("*.log"):
        with path.open("rb") as source, (folder / path.name).open("wb") as target:
            source.seek(offsets.get(path, 0))
            shutil.copyfileobj(source, target)
    return folder


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="how many rounds (default 10)")
    parser.add_argument("--seed", type=int, default=None, help="the run's seed (default: random)")
    parser.add_argument("--round", type=int, default=None, help="replay only this round of the run")
    parser.add_argument("--out", type=Path, default=None, help="where records go (default: .chaos/<seed>-<time>)")
    parser.add_argument("--lanes", type=int, default=1, help="systems that run rounds at the same time (default 1)")
    parser.add_argument(
        "--cluster", action="store_true", help="run on a RabbitMQ cluster and a PostgreSQL primary with standbys"
    )
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1, 10**9)
    rounds = [args.round] if args.round is not None else range(1, args.rounds + 1)
    out_dir = args.out or Path(".chaos") / f"{seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    mode = " on clusters" if args.cluster else ""
    print(f"fault harness{mode}: seed {seed}, {len(rounds)} round(s), records in {out_dir}", flush=True)
    summary = Summary(seed)
    try:
        asyncio.run(_stoppable(run_chaos(rounds, out_dir, summary, lanes=max(1, args.lanes), cluster=args.cluster)))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("fault harness: stopped before its last round", flush=True)
    print(json.dumps(summary.as_json(), indent=2), flush=True)
    return 1 if summary.violations else 0 if summary.finished else 130


async def _stoppable(run: Coroutine[Any, Any, None]) -> None:
    """Await ``run``, cancelling it on SIGTERM as asyncio already does on Ctrl-C, so that it cleans up."""
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    await run


if __name__ == "__main__":
    sys.exit(main())
