"""Migrations in two steps, the linter that keeps them safe, and the schema range a part runs on
(docs/deploy.md: Upgrading)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from devtools import migration_lint
from shared import migrator
from shared.migrator import LAST_UNMARKED, BadMigration, Migration, SchemaOutOfRange, Step, check_range, parse

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_every_migration_after_the_unmarked_ones_says_its_step_and_passes_the_linter() -> None:
    shipped = migrator.migrations()
    # The unmarked ones are recorded as they are: pre, in a transaction.
    assert all(m.step is Step.PRE and m.transactional for m in shipped if m.number <= LAST_UNMARKED)
    marked = migration_lint.linted_migrations()
    assert marked, "no migration after the unmarked ones: the linter would check nothing"
    assert {path.name.removesuffix(".sql") for path in marked} == {
        m.version for m in shipped if m.number > LAST_UNMARKED
    }
    assert [finding for path in marked for finding in migration_lint.lint(path)] == []


@pytest.mark.parametrize(
    ("name", "sql", "finding"),
    [
        ("drop-in-pre", "-- step: pre\nALTER TABLE outbox DROP COLUMN payload;\n", "a pre migration drops"),
        (
            "index-not-concurrently",
            "-- step: pre\nCREATE INDEX outbox_r ON outbox (routing_key);\n",
            "require-concurrent",
        ),
        (
            "concurrently-in-a-transaction",
            "-- step: pre\nCREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_r ON outbox (routing_key);\n",
            "add `-- transaction: none`",
        ),
        ("not-null-in-pre", "-- step: pre\nALTER TABLE outbox ALTER COLUMN payload SET NOT NULL;\n", "tightens"),
        ("no-step", "-- adds a column\nALTER TABLE outbox ADD COLUMN x text;\n", "-- step: pre"),
    ],
)
def test_the_linter_refuses_what_breaks_the_running_release(tmp_path: Path, name: str, sql: str, finding: str) -> None:
    path = tmp_path / f"9999_{name.replace('-', '_')}.sql"
    path.write_text(sql)
    findings = migration_lint.lint(path)
    assert any(finding in line for line in findings), findings
    assert migration_lint.main([str(path)]) == 1


def test_the_linter_lets_a_post_migration_drop_and_a_pre_one_build_an_index_concurrently(tmp_path: Path) -> None:
    post = tmp_path / "9998_drop_old.sql"
    post.write_text("-- step: post\nALTER TABLE outbox DROP COLUMN IF EXISTS payload_old;\n")
    concurrent = tmp_path / "9999_index.sql"
    concurrent.write_text(
        "-- step: pre\n-- transaction: none\n"
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_r ON outbox (routing_key);\n"
    )
    assert migration_lint.lint(post) == []
    assert migration_lint.lint(concurrent) == []


def test_marks_are_read_from_the_first_comment_lines() -> None:
    assert parse("0001_initial", "CREATE TABLE t (a int);") == Migration(
        "0001_initial", "CREATE TABLE t (a int);", Step.PRE, transactional=True
    )
    marked = parse("0100_x", "-- step: post\n-- transaction: none\n-- why\nDROP INDEX CONCURRENTLY i;\n")
    assert (marked.step, marked.transactional) == (Step.POST, False)
    with pytest.raises(BadMigration, match="0100_x"):
        parse("0100_x", "-- step: later\nSELECT 1;")
    with pytest.raises(BadMigration, match="transaction"):
        parse("0100_x", "-- step: pre\n-- transaction: maybe\nSELECT 1;")


SYNTHETIC = [
    parse("9001_table", "-- step: pre\nCREATE TABLE things (id bigint PRIMARY KEY, old text, new text);\n"),
    parse("9002_drop_old", "-- step: post\nALTER TABLE things DROP COLUMN old;\n"),
    parse(
        "9003_index",
        "-- step: pre\n-- transaction: none\nCREATE INDEX CONCURRENTLY IF NOT EXISTS things_new ON things (new);\n"
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS things_id_new ON things (id, new);\n",
    ),
]


async def recorded(url: str) -> dict[str, str]:
    conn = await asyncpg.connect(url)
    try:
        return {row["version"]: row["step"] for row in await conn.fetch("SELECT version, step FROM schema_migrations")}
    finally:
        await conn.close()


async def test_pre_runs_the_pre_migrations_and_post_the_rest_after_them(
    empty_database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(migrator, "migrations", lambda: SYNTHETIC)
    with pytest.raises(BadMigration, match="run the pre step first: 9001_table"):
        await migrator.migrate(empty_database_url, steps=[Step.POST])
    assert await recorded(empty_database_url) == {}

    assert await migrator.migrate(empty_database_url, steps=[Step.PRE]) == ["9001_table", "9003_index"]
    assert await recorded(empty_database_url) == {"9001_table": "pre", "9003_index": "pre"}
    conn = await asyncpg.connect(empty_database_url)
    try:
        indexes = {
            row["indexname"] for row in await conn.fetch("SELECT indexname FROM pg_indexes WHERE tablename = 'things'")
        }
        assert {"things_new", "things_id_new"} <= indexes
        assert await conn.fetchval("SELECT count(*) FROM information_schema.columns WHERE column_name = 'old'") == 1
        assert await migrator.migrate(empty_database_url, steps=[Step.POST]) == ["9002_drop_old"]
        assert await conn.fetchval("SELECT count(*) FROM information_schema.columns WHERE column_name = 'old'") == 0
    finally:
        await conn.close()
    assert await migrator.migrate(empty_database_url) == []


def test_a_release_runs_on_later_pre_migrations_but_not_on_a_later_post_one() -> None:
    shipped = SYNTHETIC[:1]
    check_range({"9001_table": Step.PRE}, shipped)
    check_range({"9001_table": Step.PRE, "9003_index": Step.PRE}, shipped)  # a later release's additions
    with pytest.raises(SchemaOutOfRange, match="older than this release needs: migration 9001_table"):
        check_range({}, shipped)
    with pytest.raises(SchemaOutOfRange, match="newer than this release runs on: post migration 9002_drop_old"):
        check_range({"9001_table": Step.PRE, "9002_drop_old": Step.POST}, shipped)
    # Its own post migrations, applied or not, are within its range.
    check_range({"9001_table": Step.PRE}, SYNTHETIC[:2])
    check_range({"9001_table": Step.PRE, "9002_drop_old": Step.POST}, SYNTHETIC[:2])


def test_a_release_that_needs_its_post_migration_refuses_to_start_beside_the_previous_one() -> None:
    # The schema the previous release runs on (its pre migrations, and this release's) is not enough: this
    # release's parts refuse until its post migration ran, which the previous release's parts refuse in turn.
    breaking = parse("9002_drop_old", "-- step: post\n-- needed: before start\nALTER TABLE things DROP COLUMN old;\n")
    shipped = [SYNTHETIC[0], breaking]
    with pytest.raises(SchemaOutOfRange, match="cannot run beside the previous one: post migration 9002_drop_old"):
        check_range({"9001_table": Step.PRE}, shipped)
    check_range({"9001_table": Step.PRE, "9002_drop_old": Step.POST}, shipped)
    with pytest.raises(SchemaOutOfRange, match="newer than this release runs on: post migration 9002_drop_old"):
        check_range({"9001_table": Step.PRE, "9002_drop_old": Step.POST}, SYNTHETIC[:1])
    for marks in ("-- step: pre\n-- needed: before start\n", "-- step: post\n-- needed: soon\n"):
        with pytest.raises(BadMigration, match="needed: before start"):
            parse("9004_bad", marks + "SELECT 1;\n")


async def test_a_part_on_a_database_one_migration_too_old_refuses_and_names_it(empty_database_url: str) -> None:
    shipped = migrator.migrations()
    conn = await asyncpg.connect(empty_database_url)
    try:
        await conn.execute(
            "CREATE TABLE schema_migrations (version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now(),"
            " step text NOT NULL DEFAULT 'pre')"
        )
        for migration in shipped[:-1]:
            await migrator._apply(conn, migration)
    finally:
        await conn.close()
    env = {"CHATEXPORT_DATABASE_URL": empty_database_url, "CHATEXPORT_METRICS_PORT": "0", "PATH": "/usr/bin:/bin"}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "chatexport.cli",
        "janitor",
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 1, output.decode()
    assert f"migration {shipped[-1].version} has not run" in output.decode()
    assert "chatexport migrate --pre" in output.decode()


def test_the_changelog_names_every_marked_migration_with_its_step() -> None:
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert changelog.index("## [Unreleased]") < changelog.index("### Migrations")
    for migration in migrator.migrations():
        if migration.number > LAST_UNMARKED:
            assert f"`{migration.version}` ({migration.step})" in changelog, migration.version
