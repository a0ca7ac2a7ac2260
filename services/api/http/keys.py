"""Typed application and request keys: the only way handlers reach shared resources."""

from __future__ import annotations

from typing import Any

import asyncpg
from aiohttp import web

from services.api.http.slots import ConnectionSlots
from services.api.limiting.limiter import RateLimiter
from services.api.limiting.policies import PartitionKeys, Policy, Standing
from shared.auth import Principal, TokenVerifier
from shared.monitoring import Monitor
from shared.rate_policies import PolicyName
from shared.settings import ApiPartSettings

SETTINGS = web.AppKey("settings", ApiPartSettings)
POOL = web.AppKey("pool", asyncpg.Pool)
VERIFIER = web.AppKey("verifier", TokenVerifier)
S3 = web.AppKey("s3", object)  # an aiobotocore S3 client; typed loosely because botocore is dynamic
# The client that signs download redirects' URLs for the storage endpoint clients reach.
PRESIGNER = web.AppKey("presigner", object)
# Bounds the downloads streaming at once in this process, in all and per user.
DOWNLOAD_SLOTS = web.AppKey("download_slots", ConnectionSlots)
UPLOAD_SLOTS = web.AppKey("upload_slots", ConnectionSlots)
# Bounds the long polls and event streams waiting at once in this process, in all and per user.
WAIT_SLOTS = web.AppKey("wait_slots", ConnectionSlots)
# The OpenAPI document as UTF-8 JSON (services.api.openapi), built once at start-up.
OPENAPI_DOCUMENT = web.AppKey("openapi_document", bytes)
MONITOR = web.AppKey("monitor", Monitor)
PRINCIPAL = web.RequestKey("principal", Principal)
# Each user's policies (services.api.limiting.policies), and the limiter that counts polls and downloads.
POLICIES = web.AppKey("policies", dict[PolicyName, Policy])
LIMITER = web.AppKey("limiter", RateLimiter)
PARTITION_KEYS = web.AppKey("partition_keys", PartitionKeys)
# Where the caller stands against the policies this answer concerns: its RateLimit fields show them.
RATE_LIMITS = web.RequestKey("rate_limits", tuple[Standing, ...])


def s3_client(app: web.Application) -> Any:
    """The application's S3 client."""
    return app[S3]
