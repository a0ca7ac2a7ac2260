"""What a test's bucket on the moto server holds: the keys of its objects and of its open multipart uploads."""

from __future__ import annotations

from typing import Any

from shared.settings import Settings


async def keys(s3: Any, settings: Settings) -> set[str]:
    """Keys of every object under ``exports/``."""
    listing = await s3.list_objects_v2(Bucket=settings.s3_bucket, Prefix="exports/")
    return {item["Key"] for item in listing.get("Contents", [])}


async def open_uploads(s3: Any, settings: Settings) -> set[str]:
    """Keys of the multipart uploads begun and neither completed nor aborted."""
    listing = await s3.list_multipart_uploads(Bucket=settings.s3_bucket)
    return {item["Key"] for item in listing.get("Uploads", [])}


async def objects_under(s3: Any, settings: Settings, operation_id: str) -> list[str]:
    """Keys stored in the test's bucket under the operation's artifact prefix."""
    listing = await s3.list_objects_v2(Bucket=settings.s3_bucket, Prefix=f"{settings.s3_prefix}{operation_id}/")
    return [item["Key"] for item in listing.get("Contents", [])]
