"""The previous release's own database tests, its repository and migration tests, run by its own pytest in its
own virtualenv on this release's schema (docs/deploy.md: Upgrading, The live upgrade test): its migrator is
handed this release's pre migrations (``plugins/new_schema.py``), so every database those tests build is the
schema the previous release runs on during an upgrade.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from pathlib import Path

import pytest

from devtools.releases import Release
from tests.upgrade.plugins.new_schema import FOLDER_ENV

pytestmark = pytest.mark.upgrade

REPO = Path(__file__).resolve().parents[2]
PLUGINS = Path(__file__).resolve().parent / "plugins"
# The previous release's tests that read and write the database through its repository and its migrator.
DATABASE_TESTS = [
    "tests/schema/test_migrate.py",
    "tests/pipeline/test_relay_repository.py",
    "tests/schedules/test_schedule_repository.py",
    "tests/worker/test_worker_repository.py",
]
# Out of the plugin's reach: it runs `chatexport migrate` in processes of their own, with an environment of
# two variables, so they apply the previous release's own migrations, not this release's.
OUT_OF_REACH = ["tests/schema/test_migrate.py::test_the_migrate_command_creates_migrates_and_can_run_concurrently"]
RUN_TIMEOUT_SECONDS = 600.0


async def test_the_previous_release_database_tests_pass_on_this_schema(previous: Release, tmp_path: Path) -> None:
    present = [path for path in DATABASE_TESTS if (previous.root / path).exists()]
    assert present, f"release {previous.version} has none of {DATABASE_TESTS}"
    env = {
        # No setting of ours, but the test servers' addresses (CHATEXPORT_TEST_*), which both releases read.
        **{
            key: value
            for key, value in os.environ.items()
            if key.startswith("CHATEXPORT_TEST_") or not key.startswith(("CHATEXPORT_", "PYTEST_"))
        },
        "PYTHONPATH": str(PLUGINS),
        FOLDER_ENV: str(REPO / "shared" / "migrations"),
    }
    output = tmp_path / "pytest.log"
    with output.open("wb") as sink:  # a file, not a pipe: wait() would also wait for the pipe's other ends
        process = await asyncio.create_subprocess_exec(
            str(previous.python),
            *("-m", "pytest", "-p", "new_schema", "-p", "no:cacheprovider", "-q", *present),
            *(f"--deselect={test}" for test in OUT_OF_REACH),
            cwd=previous.root,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
        try:
            code = await asyncio.wait_for(process.wait(), RUN_TIMEOUT_SECONDS)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise
    text = output.read_text(errors="replace")
    assert code == 0, text[-6000:]
    passed = re.search(r"(\d+) passed", text)
    assert passed and int(passed[1]) >= len(present), text[-2000:]
    print(f"release {previous.version}'s database tests on this schema: {passed[0]}")
