"""``GET /v3/limits``: every policy the caller is held to and what remains of each (docs/api.md: Rate limits)."""

from __future__ import annotations

from aiohttp import web

from services.api.http.bodies import validate_query
from services.api.http.contract import NO_STORE_HEADER, Answer, Endpoint
from services.api.http.keys import DOWNLOAD_SLOTS, POLICIES, POOL, PRINCIPAL, SETTINGS, UPLOAD_SLOTS, WAIT_SLOTS
from services.api.http.responses import NO_STORE, json_response
from services.api.http.schemas import EmptyQuery, Limits
from services.api.limiting.policies import Policy, is_exempt
from shared.rate_policies import WINDOWED, PolicyName
from shared.repository.rate_limits import holdings, take_allowance

# The per-user caps on long-held connections, which are per API process: what remains in the one answering.
_SLOTS = {
    PolicyName.OPEN_DOWNLOADS: DOWNLOAD_SLOTS,
    PolicyName.OPEN_WAITERS: WAIT_SLOTS,
    PolicyName.OPEN_UPLOADS: UPLOAD_SLOTS,
}


async def get_limits(request: web.Request) -> web.Response:
    """Each policy with its quota, window and unit, what remains and when the window renews. A windowed
    policy's remainder is the database's: what API processes took for their local shares counts as used.
    """
    validate_query(EmptyQuery, request)
    user_id = request[PRINCIPAL].user_id
    policies = request.app[POLICIES]
    remaining: dict[PolicyName, tuple[int, float | None]] = {}
    async with request.app[POOL].acquire() as conn:
        # Read from the database without taking from them.
        for name in WINDOWED:
            policy = policies[name]
            assert policy.window_seconds is not None
            window = await take_allowance(
                conn,
                user_id=user_id,
                policy=name.value,
                quota=policy.quota,
                window_seconds=policy.window_seconds,
                wanted=0,
            )
            remaining[name] = (window.remaining, window.reset_seconds)
        held = await holdings(conn, user_id=user_id)
    content = policies[PolicyName.CONTENT_BYTES]
    remaining[PolicyName.CONTENT_BYTES] = (content.quota - held.content_bytes, held.next_expiry_seconds)
    remaining[PolicyName.ACTIVE_EXPORTS] = (policies[PolicyName.ACTIVE_EXPORTS].quota - held.active_exports, None)
    for name, key in _SLOTS.items():
        remaining[name] = (policies[name].quota - request.app[key].held_by(user_id), None)
    body = {
        "exempt": is_exempt(request[PRINCIPAL], request.app[SETTINGS]),
        "policies": [_shown(policies[name], *remaining[name]) for name in PolicyName],
    }
    return json_response(body, headers=NO_STORE)


def _shown(policy: Policy, remaining: int, reset_seconds: float | None) -> dict[str, object]:
    return {
        "policy": policy.name.value,
        "quota": policy.quota,
        "window_seconds": policy.window_seconds,
        "unit": policy.unit or "requests",
        "remaining": max(0, remaining),
        "reset_seconds": None if reset_seconds is None else max(0, int(-(-reset_seconds // 1))),
    }


ENDPOINTS = (
    Endpoint(
        route="getLimits",
        handler=get_limits,
        summary="The caller's rate limits and what remains of each",
        tag="exports",
        description="Every policy the caller is held to: submits, polls and downloads per window, the storage "
        "budget (`content-bytes`), and the bounds on what is held at once (`active-exports`, and the `open-*` "
        "ones, per API process). Counts as a poll.",
        answers=(Answer(200, "The policies.", Limits, headers={"Cache-Control": NO_STORE_HEADER}),),
        problems=("VALIDATION_FAILED",),
    ),
)
