"""A receiver of chatexport's completion callbacks, verified with the Standard Webhooks reference library
(``pip install standardwebhooks``). Run it with the caller's secret from ``GET /v3/webhooks/secret``:

    CHATEXPORT_WEBHOOK_SECRET=whsec_... python callback_receiver.py 8000
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


def verified_event(secrets: list[str], body: bytes, headers: Mapping[str, str]) -> dict[str, Any]:
    """The callback's event once one of ``secrets`` (``whsec_...``) verifies it; raises
    ``WebhookVerificationError`` for a wrong signature or a timestamp more than five minutes off.
    """
    for secret in secrets:
        try:
            event: dict[str, Any] = Webhook(secret).verify(body, dict(headers))
            return event
        except WebhookVerificationError:
            continue
    raise WebhookVerificationError("no secret verifies the callback")


class CallbackHandler(BaseHTTPRequestHandler):
    """Answers 204 to a verified callback and 400 to any other POST; chatexport retries anything but 2xx."""

    secrets: list[str] = []
    seen: set[str] = set()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        try:
            event = verified_event(self.secrets, body, self.headers)
        except WebhookVerificationError:
            self.send_response(400)
            self.end_headers()
            return
        # Delivery is at least once and webhook-id is the same on every retry of one event: act once.
        if self.headers["webhook-id"] not in self.seen:
            self.seen.add(self.headers["webhook-id"])
            print(event["type"], event["data"]["operation_id"], event["data"]["state"], flush=True)
        self.send_response(204)
        self.end_headers()


if __name__ == "__main__":
    # During a key rotation GET /v3/webhooks/secret gives the previous secret too: accept both for a while.
    CallbackHandler.secrets = os.environ["CHATEXPORT_WEBHOOK_SECRET"].split()
    HTTPServer(("127.0.0.1", int(sys.argv[1])), CallbackHandler).serve_forever()
