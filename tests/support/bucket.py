"""What a test's bucket on the moto server holds: the keys of its objects and of its open multipart uploads."""

from __future__ import annotations

from typing import Any

from shared.settings import Settings
from shared.storage import ObjectPages


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


async def uploads(s3: Any, settings: Settings) -> set[tuple[str, str]]:
    listing = await s3.list_multipart_uploads(Bucket=settings.s3_bucket)
    return {(item["Key"], item["UploadId"]) for item in listing.get("Uploads", [])}


async def all_keys(s3: Any, settings: Settings) -> set[str]:
    listing = await s3.list_objects_v2(Bucket=settings.s3_bucket)
    return {item["Key"] for item in listing.get("Contents", [])}


async def put(s3: Any, settings: Settings, key: str) -> str:
    await s3.put_object(Bucket=settings.s3_bucket, Key=key, Body=b"{}\n")
    return key


async def start_upload(s3: Any, settings: Settings, key: str) -> tuple[str, str]:
    created = await s3.create_multipart_upload(Bucket=settings.s3_bucket, Key=key)
    return key, created["UploadId"]


async def older_than_grace(s3: Any, settings: Settings, grace_seconds: float) -> bool:
    """True once every object in the bucket is past ``grace_seconds``, as the janitor measures age."""
    objects, _ = await ObjectPages(s3, bucket=settings.s3_bucket, prefix="").next_page(1000)
    return all(item.age_seconds > grace_seconds for item in objects)
