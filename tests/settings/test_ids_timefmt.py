"""Unit tests of the shared building blocks: ids, timestamps, settings and the request fingerprint."""

from __future__ import annotations

import hashlib
import os
import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import ValidationError

from services.api.http.schemas import ExportSubmission
from shared.export.fingerprint import fingerprint
from shared.export.request import ExportRequest
from shared.ids import is_operation_id, is_valid_id, new_operation_id
from shared.settings import PLACEHOLDER_JWT_SECRET, Settings
from shared.timefmt import format_timestamp, parse_timestamp

# --- ids -----------------------------------------------------------------------------------------------


def test_operation_ids_are_opaque_url_safe_and_unique() -> None:
    ids = {new_operation_id() for _ in range(1000)}

    assert len(ids) == 1000
    for operation_id in ids:
        assert len(operation_id) <= 64
        assert re.fullmatch(r"op_[A-Za-z0-9_-]{24}", operation_id)  # 24 base64 chars = 144 random bits
        assert is_operation_id(operation_id)


@pytest.mark.parametrize("value", ["", "x" * 65, "op_a/b", "op_a.b", "op_\x00", "op_é"])
def test_what_cannot_be_an_operation_id(value: str) -> None:
    assert not is_operation_id(value)


@pytest.mark.parametrize("value", ["u", "u-a", "A.b:c_d-9", "x" * 64])
def test_valid_ids(value: str) -> None:
    assert is_valid_id(value)


@pytest.mark.parametrize("value", ["", "x" * 65, "u a", "u/a", "u\x00", "ü", "u\n", "u-a\n"])
def test_invalid_ids(value: str) -> None:
    assert not is_valid_id(value)


# --- timestamps ----------------------------------------------------------------------------------------


def test_format_timestamp_is_utc_milliseconds_with_z() -> None:
    plus_two = timezone(timedelta(hours=2))

    assert format_timestamp(datetime(2026, 11, 30, 10, 0, 0, 123999, tzinfo=plus_two)) == "2026-11-30T08:00:00.123Z"
    assert format_timestamp(datetime(2026, 11, 30, 8, 0, tzinfo=UTC)) == "2026-11-30T08:00:00.000Z"
    assert format_timestamp(datetime(999, 1, 2, 3, 4, 5, 6789, tzinfo=UTC)) == "0999-01-02T03:04:05.006Z"
    assert format_timestamp(datetime(1, 1, 1, tzinfo=UTC)) == "0001-01-01T00:00:00.000Z"
    assert format_timestamp(None) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-30T08:00:00Z", datetime(2026, 11, 30, 8, 0, tzinfo=UTC)),
        ("2026-11-30T08:00:00.123456Z", datetime(2026, 11, 30, 8, 0, 0, 123000, tzinfo=UTC)),
        ("2026-11-30T09:30:00.5+01:30", datetime(2026, 11, 30, 8, 0, 0, 500000, tzinfo=UTC)),
    ],
)
def test_parse_timestamp_converts_to_utc_and_truncates_to_milliseconds(text: str, expected: datetime) -> None:
    parsed = parse_timestamp(text)

    assert parsed == expected
    assert parsed.tzinfo == UTC


@pytest.mark.parametrize("text", ["2026-11-30T08:00:00", "2026-11-30", "yesterday", ""])
def test_parse_timestamp_refuses_text_without_a_zone(text: str) -> None:
    with pytest.raises(ValueError):
        parse_timestamp(text)


def test_format_and_parse_round_trip() -> None:
    text = "2026-11-30T08:00:00.042Z"

    assert format_timestamp(parse_timestamp(text)) == text


# --- settings ------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # The developer's own CHATEXPORT_* variables must not change what these tests see.
    for name in [name for name in os.environ if name.startswith("CHATEXPORT_")]:
        monkeypatch.delenv(name)


def test_production_refuses_the_placeholder_secret() -> None:
    with pytest.raises(ValidationError, match="placeholder"):
        Settings(environment="production")


def test_production_starts_with_a_real_secret_and_development_with_the_placeholder() -> None:
    real = "a-real-secret-from-the-vault-32-bytes-or-more"
    assert Settings(environment="production", jwt_secret=real, webhook_signing_key=real).environment == "production"
    assert Settings().jwt_secret == PLACEHOLDER_JWT_SECRET
    with pytest.raises(ValidationError, match="WEBHOOK_SIGNING_KEY is the development placeholder"):
        Settings(environment="production", jwt_secret=real)
    with pytest.raises(ValidationError, match="for development and tests only"):
        Settings(environment="production", jwt_secret=real, webhook_signing_key=real, webhook_allow_private=True)


def test_production_refuses_a_secret_shorter_than_32_bytes() -> None:
    with pytest.raises(ValidationError, match="at least 32 bytes"):
        Settings(environment="production", jwt_secret="x" * 31, webhook_signing_key="k")
    assert Settings(environment="production", jwt_secret="x" * 32, webhook_signing_key="k").jwt_secret == "x" * 32


def test_production_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHATEXPORT_ENVIRONMENT", "production")

    with pytest.raises(ValidationError, match="placeholder"):
        Settings()


@pytest.mark.parametrize("heartbeat", [30.0, 31.0])
def test_heartbeat_must_be_shorter_than_the_lease(heartbeat: float) -> None:
    with pytest.raises(ValidationError, match="HEARTBEAT"):
        Settings(lease_seconds=30.0, heartbeat_seconds=heartbeat)


def test_defaults_match_the_documented_settings() -> None:
    settings = Settings()

    assert (settings.api_host, settings.api_port) == ("127.0.0.1", 8080)
    assert settings.message_body_max_bytes == 6
    assert settings.message_request_max_bytes == 4096
    assert settings.import_body_max_bytes == 64 * 1024


# --- fingerprint ---------------------------------------------------------------------------------------


def _fingerprint(
    *, conversation_id: str = "c-a", user_id: str = "u-a", before_seq: int | None = None, after_seq: int = 0
) -> str:
    request = ExportRequest(format="jsonl", before_seq=before_seq, after_seq=after_seq)
    return fingerprint(user_id=user_id, conversation_id=conversation_id, request=request)


def test_defaults_give_equal_fingerprints() -> None:
    def from_body(body: dict[str, object]) -> str:
        submission = ExportSubmission.model_validate(body)
        request = ExportRequest(submission.format, submission.before_seq, submission.after_seq)
        return fingerprint(user_id="u-a", conversation_id="c-a", request=request)

    assert from_body({"format": "jsonl"}) == from_body({"format": "jsonl", "after_seq": 0})
    assert from_body({"format": "jsonl"}) == from_body({"format": "jsonl", "before_seq": None})
    assert re.fullmatch(r"[0-9a-f]{64}", from_body({"format": "jsonl"}))


@pytest.mark.parametrize(
    "other",
    [
        {"conversation_id": "c-b"},
        {"user_id": "u-b"},
        {"after_seq": 1},
        {"before_seq": 9},
    ],
)
def test_any_other_canonical_request_differs(other: dict[str, Any]) -> None:
    assert _fingerprint(**other) != _fingerprint()


@pytest.mark.parametrize("prefix", ["", "exports", "/", "/exports/", "backups/exports"])
def test_the_export_prefix_must_be_a_folder_of_its_own(prefix: str) -> None:
    # The janitor deletes what no record names under the prefix: "" or "exports" would reach other data.
    with pytest.raises(ValidationError, match="s3_prefix"):
        Settings(s3_prefix=prefix)


def test_a_nested_export_prefix_is_a_folder_too() -> None:
    assert Settings(s3_prefix="chat/exports/").s3_prefix == "chat/exports/"


def test_a_request_without_notify_keeps_the_fingerprint_it_always_had() -> None:
    request = ExportRequest(format="jsonl", before_seq=None, after_seq=0)
    # The canonical form before callbacks existed: keys stored then must still replay.
    canonical = '{"after_seq":0,"before_seq":null,"conversation_id":"c-a","format":"jsonl","user":"alice"}'
    assert (
        fingerprint(user_id="alice", conversation_id="c-a", request=request)
        == hashlib.sha256(canonical.encode()).hexdigest()
    )
    notified = ExportRequest(format="jsonl", before_seq=None, after_seq=0, notify_url="https://example.com/h")
    assert fingerprint(user_id="alice", conversation_id="c-a", request=notified) != fingerprint(
        user_id="alice", conversation_id="c-a", request=request
    )
