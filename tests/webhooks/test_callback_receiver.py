"""The callback receiver of the docs (docs/callbacks.md: Receive and verify completion callbacks), run as
written against the service's own signatures: it accepts a callback signed for its user, with the
current or, during a rotation, the previous key, and refuses a changed body or another user's signature.
"""

from __future__ import annotations

import importlib.util
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import HTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from shared.webhooks.signing import secret_text, signature_header, user_secret

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "callback_receiver.py"
CURRENT, PREVIOUS = b"c" * 32, b"p" * 32
BODY = json.dumps({"type": "export.succeeded", "data": {"operation_id": "op_1", "state": "SUCCEEDED"}}).encode()


@pytest.fixture(scope="module")
def receiver() -> ModuleType:
    spec = importlib.util.spec_from_file_location("callback_receiver", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def signed(keys: list[bytes], user: str = "alice", body: bytes = BODY) -> dict[str, str]:
    timestamp = int(time.time())
    secrets = [user_secret(key, user) for key in keys]
    header = signature_header(secrets, webhook_id="msg_1", timestamp=timestamp, body=body)
    return {"webhook-id": "msg_1", "webhook-timestamp": str(timestamp), "webhook-signature": header}


def test_a_callback_signed_for_the_user_is_accepted(receiver: Any) -> None:
    event = receiver.verified_event([secret_text(user_secret(CURRENT, "alice"))], BODY, signed([CURRENT]))
    assert event["data"]["operation_id"] == "op_1"


def test_during_a_rotation_a_receiver_with_either_secret_accepts(receiver: Any) -> None:
    headers = signed([CURRENT, PREVIOUS])
    for key in (CURRENT, PREVIOUS):
        assert receiver.verified_event([secret_text(user_secret(key, "alice"))], BODY, headers)["type"]


@pytest.mark.parametrize(
    ("headers", "body"),
    [(signed([CURRENT], user="bob"), BODY), (signed([CURRENT]), BODY.replace(b"op_1", b"op_2"))],
    ids=["another user's signature", "a changed body"],
)
def test_anything_else_is_refused(receiver: Any, headers: dict[str, str], body: bytes) -> None:
    with pytest.raises(receiver.WebhookVerificationError):
        receiver.verified_event([secret_text(user_secret(CURRENT, "alice"))], body, headers)


@pytest.fixture
def serving(receiver: Any) -> Iterator[str]:
    receiver.CallbackHandler.secrets = [secret_text(user_secret(CURRENT, "alice"))]
    server = HTTPServer(("127.0.0.1", 0), receiver.CallbackHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def post(url: str, body: bytes, headers: dict[str, str]) -> int:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def test_the_server_answers_204_to_a_verified_callback_and_400_to_a_forged_one(serving: str) -> None:
    assert post(serving, BODY, signed([CURRENT])) == 204
    assert post(serving, BODY, signed([PREVIOUS])) == 400
