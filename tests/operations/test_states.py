"""The state machine (docs/states.md: States and failure model) and the worker's retry decisions."""

from __future__ import annotations

import asyncpg
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from services.worker.errors import PermanentError, backoff_seconds, classify, error_name
from shared.object_writer import StoredBytesDiffer
from shared.settings import Settings
from shared.states import ACTIVE, TERMINAL, TRANSITIONS, State, sources_of

DOCUMENTED_TRANSITIONS = {
    ("QUEUED", "RUNNING"),
    ("QUEUED", "CANCEL_REQUESTED"),
    ("RUNNING", "SUCCEEDED"),
    ("RUNNING", "RETRY_AT"),
    ("RUNNING", "FAILED"),
    ("RUNNING", "FAILED_REPAIR"),
    ("RUNNING", "CANCEL_REQUESTED"),
    ("RUNNING", "RUNNING"),
    ("RETRY_AT", "RUNNING"),
    ("RETRY_AT", "CANCEL_REQUESTED"),
    ("CANCEL_REQUESTED", "CANCELED"),
    ("SUCCEEDED", "EXPIRED"),
    ("FAILED_REPAIR", "QUEUED"),
}


def test_transitions_are_exactly_the_documented_ones() -> None:
    listed = {(source.value, target.value) for source, targets in TRANSITIONS.items() for target in targets}
    assert listed == DOCUMENTED_TRANSITIONS
    assert set(TRANSITIONS) == set(State)


def test_nothing_follows_succeeded_but_expiry_and_cancel_cannot_reach_it() -> None:
    assert sources_of(State.SUCCEEDED) == ["RUNNING"]
    assert sources_of(State.CANCEL_REQUESTED) == ["QUEUED", "RETRY_AT", "RUNNING"]
    assert State.SUCCEEDED not in TRANSITIONS[State.CANCEL_REQUESTED]
    assert TRANSITIONS[State.CANCELED] == TRANSITIONS[State.FAILED] == TRANSITIONS[State.EXPIRED] == frozenset()


def test_active_and_terminal_partition_the_states() -> None:
    assert set(State) == ACTIVE | TERMINAL
    assert not ACTIVE & TERMINAL
    assert {State.QUEUED, State.RUNNING, State.RETRY_AT, State.CANCEL_REQUESTED} == ACTIVE


SETTINGS = Settings(retry_base_seconds=2, retry_cap_seconds=60, max_attempts=4)


@pytest.mark.parametrize(
    "error",
    [
        EndpointConnectionError(endpoint_url="http://s3"),
        ClientError({"Error": {"Code": "InternalError"}, "ResponseMetadata": {"HTTPStatusCode": 503}}, "PutObject"),
        ClientError({"Error": {"Code": "SlowDown"}, "ResponseMetadata": {"HTTPStatusCode": 400}}, "PutObject"),
        ClientError({"Error": {"Code": "NoSuchBucket"}, "ResponseMetadata": {"HTTPStatusCode": 404}}, "PutObject"),
        asyncpg.ConnectionDoesNotExistError("gone"),
        ConnectionResetError(),
        TimeoutError(),
        RuntimeError("something unexpected"),
        StoredBytesDiffer("part 1: S3 stored other bytes than were sent"),
    ],
)
def test_transient_and_unexpected_errors_retry_until_the_budget_is_spent(error: Exception) -> None:
    for attempt in range(1, SETTINGS.max_attempts):
        outcome = classify(error, attempt=attempt, settings=SETTINGS)
        assert outcome.state == State.RETRY_AT
        assert outcome.retry_delay_seconds is not None and outcome.retry_delay_seconds > 0
        assert outcome.message
    spent = classify(error, attempt=SETTINGS.max_attempts, settings=SETTINGS)
    assert spent.state == State.FAILED_REPAIR
    assert spent.retry_delay_seconds is None
    assert "requeue" in spent.message
    assert ".." not in spent.message and ".." not in outcome.message


def test_stored_bytes_that_differ_have_a_code_of_their_own_not_a_storage_outage() -> None:
    """An attempt whose bytes S3 stored otherwise is retried under ``STORED_BYTES_DIFFER`` (docs/states.md: States
    and failure model)."""
    error = StoredBytesDiffer("g1.jsonl: S3 stored other bytes than were sent")
    retried = classify(error, attempt=1, settings=SETTINGS)
    parked = classify(error, attempt=SETTINGS.max_attempts, settings=SETTINGS)
    assert (retried.state, retried.code) == (State.RETRY_AT, "STORED_BYTES_DIFFER")
    assert (parked.state, parked.code) == (State.FAILED_REPAIR, "STORED_BYTES_DIFFER")


def test_permanent_errors_fail_at_once() -> None:
    outcome = classify(PermanentError("ACCESS_REVOKED", "gone"), attempt=1, settings=SETTINGS)
    assert (outcome.state, outcome.code, outcome.retry_delay_seconds) == (State.FAILED, "ACCESS_REVOKED", None)


def test_backoff_grows_exponentially_with_jitter_up_to_the_cap() -> None:
    for attempt, ceiling in [(1, 2), (2, 4), (3, 8), (4, 16), (5, 32), (6, 60), (12, 60)]:
        delays = [backoff_seconds(attempt, SETTINGS) for _ in range(200)]
        assert all(ceiling / 2 <= delay <= ceiling for delay in delays), (attempt, min(delays), max(delays))
        assert len(set(delays)) > 1  # jitter


def test_error_names_carry_the_s3_error_code() -> None:
    missing = ClientError({"Error": {"Code": "NoSuchBucket"}, "ResponseMetadata": {"HTTPStatusCode": 404}}, "PutObject")
    assert error_name(missing) == "ClientError:NoSuchBucket"
    assert error_name(ConnectionResetError()) == "ConnectionResetError"
