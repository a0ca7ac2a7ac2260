"""The ``chatexport`` argument wiring: subcommands, their options and what they print."""

from __future__ import annotations

import asyncio
import importlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic_settings import BaseSettings

from chatexport import cli
from shared.auth import InvalidToken, TokenVerifier
from shared.lifecycle import PARENT_PID_ENV
from shared.settings import Settings


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Development defaults whatever the calling shell exported."""
    # PARENT_PID_ENV would tie this test process to its parent (PR_SET_PDEATHSIG) in the part tests.
    for name in ("CHATEXPORT_JWT_SECRET", "CHATEXPORT_JWT_ISSUER", "CHATEXPORT_JWT_AUDIENCE", PARENT_PID_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CHATEXPORT_ENVIRONMENT", "development")


def verify(token: str) -> Any:
    return asyncio.run(TokenVerifier(Settings()).verify(f"Bearer {token}"))


def test_token_prints_a_jwt_the_verifier_accepts(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["token", "--sub", "alice"]) == 0
    principal = verify(capsys.readouterr().out.strip())
    assert principal.user_id == "alice"
    assert not principal.is_admin


def test_token_admin_flag_adds_the_scope(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["token", "--sub", "ops-1", "--admin", "--ttl", "60"]) == 0
    assert verify(capsys.readouterr().out.strip()).is_admin


def test_token_uses_the_configured_secret(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHATEXPORT_JWT_SECRET", "another-secret-of-enough-length-0123456789")
    assert cli.main(["token", "--sub", "alice"]) == 0
    token = capsys.readouterr().out.strip()
    assert verify(token).user_id == "alice"
    monkeypatch.delenv("CHATEXPORT_JWT_SECRET")
    with pytest.raises(InvalidToken):
        verify(token)


@pytest.mark.parametrize(
    "argv",
    [
        ["no-such-command"],
        [],
        ["token"],  # --sub is required
        ["token", "--sub", "bad user"],  # outside the id alphabet
        ["token", "--sub", "alice", "--ttl", "0"],
        ["token", "--sub", "alice", "--ttl", "soon"],
        ["import", "--all", "--language", "chinese"],  # mutually exclusive
        ["dev", "--workers", "0"],
    ],
)
def test_usage_errors_exit_non_zero(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        cli.main(argv)
    assert stopped.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_invalid_settings_are_reported_not_raised(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHATEXPORT_ENVIRONMENT", "production")  # with the placeholder secret: refused
    assert cli.main(["token", "--sub", "alice"]) == 2
    assert "invalid settings" in capsys.readouterr().err


@pytest.mark.parametrize(
    "proxy_url",
    [
        "http://relay:pr0xy-s3cret@proxy.internal:3128",
        "socks5://relay:pr0xy-s3cret@proxy.internal:1080",
        # Short enough that pydantic's shortened quote of the input keeps its end, the password whole.
        "http://egress:s3cret@10.1.2.3:3128",
    ],
)
def test_a_settings_error_never_shows_the_proxy_password(
    proxy_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHATEXPORT_ENVIRONMENT", "production")  # with the placeholder secret: refused
    monkeypatch.setenv("CHATEXPORT_WEBHOOK_PROXY_URL", proxy_url)
    assert cli.main(["token", "--sub", "alice"]) == 2
    error = capsys.readouterr().err
    password = proxy_url.split(":")[2].split("@")[0]
    assert "invalid settings" in error and password not in error


@pytest.mark.parametrize("part", ["api", "relay", "worker", "janitor"])
def test_part_subcommands_call_the_parts_main_with_settings(part: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[BaseSettings] = []
    settings_class = cli.PARTS[part].settings
    monkeypatch.setattr(importlib.import_module(cli.PARTS[part].module), "main", calls.append)
    monkeypatch.setenv("CHATEXPORT_METRICS_PORT", "18099")

    assert cli.main([part]) == 0
    assert len(calls) == 1 and type(calls[0]) is settings_class
    assert calls[0].metrics_port == 18099  # type: ignore[attr-defined]


def test_each_part_builds_only_the_groups_it_uses() -> None:
    # The worker never verifies a token, the relay serves no HTTP API: neither reads those settings.
    fields = {part: set(cli.PARTS[part].settings.model_fields) for part in cli.PARTS}
    assert "jwt_secret" in fields["api"] and "jwt_secret" not in fields["worker"] | fields["relay"] | fields["janitor"]
    assert "api_port" not in fields["relay"] | fields["janitor"]
    assert all(issubclass(Settings, cli.PARTS[part].settings) for part in cli.PARTS)
    assert set().union(*fields.values()) == set(Settings.model_fields)


def test_import_refuses_an_unknown_language_before_connecting(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHATEXPORT_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")  # never reached
    assert cli.main(["import", "--language", "klingon"]) == 2
    assert "unknown corpus language(s): klingon" in capsys.readouterr().err


def test_import_and_dev_options_are_parsed() -> None:
    parser = cli.build_parser()
    args = parser.parse_args(["import", "--language", "chinese", "--language", "english", "--limit-files", "3"])
    assert (args.handler, args.language, args.limit_files) == (cli._cmd_import, ["chinese", "english"], 3)
    args = parser.parse_args(["dev"])
    assert (args.handler, args.workers, args.language, args.no_import) == (cli._cmd_dev, 2, None, False)


def test_module_entry_point_runs_as_a_program() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "chatexport.cli", "token", "--sub", "bob"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": "/usr/bin:/bin", "CHATEXPORT_ENVIRONMENT": "development"},
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.returncode == 0, result.stderr
    assert verify(result.stdout.strip()).user_id == "bob"


@pytest.mark.parametrize("timeout", ["-1", "0", "nan", "inf", "soon"])
def test_health_refuses_a_timeout_that_is_not_a_positive_number_of_seconds(
    timeout: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["health", "--timeout", timeout])

    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert "positive number of seconds" in err or "is not a number of seconds" in err


@pytest.mark.parametrize(
    ("url", "live", "asked"),
    [
        ("http://127.0.0.1:9100", False, "http://127.0.0.1:9100/readyz"),
        ("http://127.0.0.1:9100/", False, "http://127.0.0.1:9100/readyz"),
        ("http://127.0.0.1:9100/", True, "http://127.0.0.1:9100/healthz"),
        ("https://api.internal", True, "https://api.internal/healthz"),
        ("http://[::1]:9100", False, "http://[::1]:9100/readyz"),
        # A URL with a path is the endpoint itself, whatever --live says.
        ("http://127.0.0.1:9100/readyz", True, "http://127.0.0.1:9100/readyz"),
        ("http://127.0.0.1:9100/monitoring/readyz", False, "http://127.0.0.1:9100/monitoring/readyz"),
    ],
)
def test_health_url_asks_a_base_urls_probe_and_a_full_url_as_it_is(url: str, live: bool, asked: str) -> None:
    assert cli.health_url(url, "/healthz" if live else "/readyz") == asked
