"""S3 access: the client factory, the bucket, and artifact keys (contract section 6)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError

from shared.settings import Settings

# What an unreachable, failing or misconfigured S3 raises.
STORAGE_ERRORS: tuple[type[BaseException], ...] = (BotoCoreError, ClientError)
# Pooled S3 connections beyond the download cap, for uploads, verification and deletes.
S3_SPARE_CONNECTIONS = 16


def artifact_prefix(settings: Settings, operation_id: str) -> str:
    """Every object of one operation lives under ``<s3_prefix><operation_id>/``."""
    return f"{settings.s3_prefix}{operation_id}/"


def artifact_key(settings: Settings, operation_id: str, generation: int) -> str:
    """The object key of one attempt, derived from (operation, fencing generation)."""
    return f"{artifact_prefix(settings, operation_id)}g{generation}.jsonl"


@contextlib.asynccontextmanager
async def s3_client(settings: Settings) -> AsyncIterator[Any]:
    """Yield an aiobotocore S3 client with timeouts and a bounded pool; closed on exit."""
    config = AioConfig(
        connect_timeout=settings.s3_timeout_seconds,
        read_timeout=settings.s3_timeout_seconds,
        # Downloads hold a connection while a client reads; keep room for everything else.
        max_pool_connections=settings.download_concurrency + S3_SPARE_CONNECTIONS,
        retries={"max_attempts": 2, "mode": "standard"},
        s3={"addressing_style": "path"},
    )
    session = get_session()
    async with session.create_client(
        "s3",
        endpoint_url=settings.s3_endpoint_url,
        region_name=settings.s3_region,
        aws_access_key_id=settings.s3_access_key_id,
        aws_secret_access_key=settings.s3_secret_access_key,
        config=config,
    ) as client:
        yield client


async def ensure_bucket(client: Any, bucket: str) -> None:
    """Create ``bucket`` when it does not exist yet; an existing bucket is left alone."""
    try:
        await client.head_bucket(Bucket=bucket)
    except ClientError:
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            await client.create_bucket(Bucket=bucket)
