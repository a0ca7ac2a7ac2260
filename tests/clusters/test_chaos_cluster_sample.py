"""The fault harness in cluster mode (docs/development.md: The fault harness, Cluster mode): a short fixed-seed
sample of rounds on a three-node RabbitMQ cluster and a synchronous primary with two standbys passes every
check, with a broker node killed, a failover and paused replay among its faults.
"""

from __future__ import annotations

from pathlib import Path

from devtools.clusters import RabbitCluster
from tests.chaos.plan import CLUSTER_FAULTS, FaultKind, plan_round
from tests.chaos.run import run_rounds
from tests.chaos.system import chaos_system

# Round 1 kills the janitor and fails the database over, round 2 pauses replay on the worker's standby and
# slows S3, round 3 makes the receiver answer 500 and kills broker node 3.
SAMPLE_SEED = 20261251
SAMPLE_ROUNDS = range(1, 4)


def test_the_sample_plans_each_cluster_fault() -> None:
    planned = [fault.kind for number in SAMPLE_ROUNDS for fault in plan_round(SAMPLE_SEED, number, cluster=True).faults]

    assert set(planned) >= CLUSTER_FAULTS
    assert not {FaultKind.RESTART_BROKER, FaultKind.RESTART_DATABASE} & set(planned)


async def test_a_fixed_seed_sample_of_cluster_rounds_passes_every_check(
    rabbit_cluster: RabbitCluster, tmp_path: Path
) -> None:
    async with chaos_system(tmp_path / "system", cluster=True, rabbit=rabbit_cluster) as system:
        assert system.clusters is not None
        first_primary = system.clusters.postgres.primary
        summary = await run_rounds(system, SAMPLE_SEED, SAMPLE_ROUNDS, tmp_path)
        postgres = system.clusters.postgres
        shape = (postgres.primary, len(postgres.standbys), postgres.former_primaries)

    assert summary.violations == 0, (tmp_path / "rounds.jsonl").read_text()
    assert summary.rounds == len(SAMPLE_ROUNDS)
    assert {kind: summary.faults[kind] for kind in CLUSTER_FAULTS} == dict.fromkeys(CLUSTER_FAULTS, 1)
    assert shape[0] is not first_primary and shape[1:] == (2, []), "the failover left a primary with two standbys"
