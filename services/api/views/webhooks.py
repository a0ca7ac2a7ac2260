"""``GET /v3/webhooks/secret``: the caller's own signing secret for completion callbacks (docs/api.md: Completion
callbacks).
"""

from __future__ import annotations

from aiohttp import web

from services.api.http.bodies import validate_query
from services.api.http.contract import NO_STORE_HEADER, Answer, Endpoint
from services.api.http.keys import PRINCIPAL, SETTINGS
from services.api.http.responses import NO_STORE, json_response
from services.api.http.schemas import EmptyQuery, WebhookSecret
from shared.webhooks.signing import secret_text, user_secret


async def webhook_secret(request: web.Request) -> web.Response:
    """The caller's ``secret`` (``whsec_...``) and, while the deployment key is being rotated, the
    ``previous_secret`` that callbacks are also signed with (else null). Only its owner can read it.
    """
    validate_query(EmptyQuery, request)
    settings = request.app[SETTINGS]
    user_id = request[PRINCIPAL].user_id
    previous = settings.webhook_previous_signing_key
    return json_response(
        {
            "secret": secret_text(user_secret(settings.webhook_signing_key.encode(), user_id)),
            "previous_secret": secret_text(user_secret(previous.encode(), user_id)) if previous else None,
        },
        headers=NO_STORE,
    )


ENDPOINTS = (
    Endpoint(
        route="getWebhookSecret",
        handler=webhook_secret,
        summary="The caller's signing secret for completion callbacks",
        tag="exports",
        description="Callbacks carry Standard Webhooks signatures made with this secret (and, while the "
        "deployment key is rotated, with `previous_secret` too). Only its owner can read it.",
        answers=(Answer(200, "The secret.", WebhookSecret, headers={"Cache-Control": NO_STORE_HEADER}),),
        problems=("VALIDATION_FAILED",),
    ),
)
