"""The RateLimit fields as a Structured Fields parser reads them, the partition key, and Retry-After's floor
(docs/api.md: Rate limits, The fields)."""

from __future__ import annotations

import hashlib
import hmac
import math

import http_sfv
import pytest

from services.api.http.rate_fields import LIMIT_FIELD, POLICY_FIELD, rate_limit_fields
from services.api.limiting.policies import (
    CONTENT_BYTES_UNIT,
    PARTITION_KEY_BYTES,
    PartitionKeys,
    Policy,
    Standing,
    policies,
    retry_after_seconds,
)
from shared.rate_policies import PolicyName
from shared.settings import Settings


def items(value: str) -> list[tuple[str, dict[str, object]]]:
    parsed = http_sfv.List()
    parsed.parse(value.encode())
    return [(item.value, dict(item.params)) for item in parsed]


def test_the_fields_are_lists_of_strings_with_the_drafts_parameters() -> None:
    standings = [
        Standing(Policy(PolicyName.POLLS, 600, 60), 41, 17.2),
        Standing(Policy(PolicyName.CONTENT_BYTES, 10 * 1024**3, unit=CONTENT_BYTES_UNIT), 5, None),
    ]
    fields = rate_limit_fields(standings, b"\x01\x02\x03")
    assert items(fields[POLICY_FIELD]) == [
        ("polls", {"q": 600, "w": 60, "pk": b"\x01\x02\x03"}),
        ("content-bytes", {"q": 10 * 1024**3, "qu": "content-bytes", "pk": b"\x01\x02\x03"}),
    ]
    # t rounds up: a client that waits t seconds is never early.
    assert items(fields[LIMIT_FIELD]) == [
        ("polls", {"r": 41, "t": 18, "pk": b"\x01\x02\x03"}),
        ("content-bytes", {"r": 5, "pk": b"\x01\x02\x03"}),
    ]
    assert fields[POLICY_FIELD].startswith('"polls";q=600;w=60;pk=:')


def test_a_budget_overspent_shows_nothing_remaining() -> None:
    fields = rate_limit_fields([Standing(Policy(PolicyName.CONTENT_BYTES, 10), -5)], b"k")
    assert items(fields[LIMIT_FIELD]) == [("content-bytes", {"r": 0, "pk": b"k"})]


def test_the_partition_key_is_a_truncated_keyed_hash_never_the_id() -> None:
    settings = Settings(environment="development", rate_limit_partition_key="a-server-key")
    key = PartitionKeys(settings)("alice")
    assert len(key) == PARTITION_KEY_BYTES
    assert key == hmac.new(b"a-server-key", b"alice", hashlib.sha256).digest()[:PARTITION_KEY_BYTES]
    assert key != hashlib.sha256(b"alice").digest()[:PARTITION_KEY_BYTES]
    assert b"alice" not in key and PartitionKeys(settings)("bob") != key
    other = Settings(environment="development", rate_limit_partition_key="another-key")
    assert PartitionKeys(other)("alice") != key
    # Without a key of its own, one derived from the webhook signing key: still keyed, and not that key.
    derived = Settings(environment="development", webhook_signing_key="w" * 40)
    assert PartitionKeys(derived)("alice") != hmac.new(b"w" * 40, b"alice", hashlib.sha256).digest()[:12]
    assert PartitionKeys(derived)("alice") == PartitionKeys(derived.model_copy())("alice")


def test_retry_after_is_never_before_the_window_ends() -> None:
    for reset in (0.0, 0.2, 1.0, 59.99, 3599.5):
        for _ in range(200):
            assert retry_after_seconds(reset, margin_seconds=0.5) >= reset + 0.5
    spread = {retry_after_seconds(100.0, margin_seconds=0.0) for _ in range(200)}
    assert min(spread) >= 100 and max(spread) <= 111 and len(spread) > 1


def test_every_policy_has_a_name_of_its_own() -> None:
    shown = policies(Settings(environment="development"))
    assert set(shown) == set(PolicyName)
    assert all(name is policy.name for name, policy in shown.items())


def test_the_rate_limit_field_is_what_the_structured_fields_library_writes() -> None:
    """The ``RateLimit`` items are written around a name and a ``pk`` serialised once; for every policy, figure
    and partition key they read exactly as ``http-sfv`` serialises the whole list.
    """
    shown = policies(Settings(environment="development"))
    keys = [b"k", bytes(range(12)), b"\xff" * 12]
    figures = [(0, None), (1, 0.0), (41, 17.2), (-5, 0.4), (10 * 1024**3, 3599.01), (999_999_999_999_999, None)]
    for key in keys:
        for remaining, reset in figures:
            standings = [Standing(policy, remaining, reset) for policy in shown.values()]
            expected = http_sfv.List()
            for standing in standings:
                item = http_sfv.Item(standing.policy.name.value)
                item.params["r"] = max(0, remaining)
                if reset is not None:
                    item.params["t"] = max(0, math.ceil(reset))
                item.params["pk"] = key
                expected.append(item)
            assert rate_limit_fields(standings, key)[LIMIT_FIELD] == str(expected)
    with pytest.raises(ValueError, match="15 digits"):
        rate_limit_fields([Standing(shown[PolicyName.POLLS], 10**15)], b"k")
