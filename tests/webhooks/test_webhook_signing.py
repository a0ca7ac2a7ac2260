"""Standard Webhooks signatures and per-user secrets (docs/api.md: Completion callbacks)."""

from __future__ import annotations

import base64

from shared.webhooks.signing import secret_text, signature, signature_header, user_secret


def test_the_signature_matches_the_standard_webhooks_reference_example() -> None:
    secret = base64.b64decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    signed = signature(
        secret, webhook_id="msg_p5jXN8AQM9LWM0D4loKWxJek", timestamp=1614265330, body=b'{"test": 2432232314}'
    )
    assert signed == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_each_user_has_a_secret_of_their_own() -> None:
    key = b"k" * 32
    alice, bob = user_secret(key, "alice"), user_secret(key, "bob")
    assert len(alice) == 32 and alice != bob
    assert user_secret(key, "alice") == alice
    assert user_secret(b"other" * 8, "alice") != alice
    assert secret_text(alice).startswith("whsec_") and base64.b64decode(secret_text(alice)[6:]) == alice


def test_during_a_rotation_both_keys_sign() -> None:
    current, previous = b"c" * 32, b"p" * 32
    header = signature_header([current, previous], webhook_id="msg_1", timestamp=1, body=b"{}")
    assert header.split(" ") == [
        signature(current, webhook_id="msg_1", timestamp=1, body=b"{}"),
        signature(previous, webhook_id="msg_1", timestamp=1, body=b"{}"),
    ]
