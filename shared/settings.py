"""Settings of every chatexport part, read from ``CHATEXPORT_*`` environment variables (README: Settings).

One class serves all parts so that a deployment configures them alike; each part reads only what it
needs. Build it once in ``main()`` and pass it down: nothing imports a global instance.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.webhooks.targets import RefusedTarget, normalise_host

PLACEHOLDER_JWT_SECRET = "dev-only-insecure-secret-change-me"
PLACEHOLDER_WEBHOOK_SIGNING_KEY = "dev-only-insecure-webhook-key-change-me"
MIN_JWT_SECRET_BYTES = 32


class Settings(BaseSettings):
    """Typed configuration; durations are in seconds, sizes in bytes.

    Raises ``pydantic.ValidationError`` on a bad value, and refuses to build outside development with the
    placeholder JWT secret (README: Settings).
    """

    model_config = SettingsConfigDict(env_prefix="CHATEXPORT_", extra="ignore")

    environment: Literal["development", "production"] = "development"
    log_level: str = "INFO"

    database_url: str = "postgresql://postgres@127.0.0.1:5432/chatexport"
    database_pool_max: int = Field(10, ge=1)
    database_timeout_seconds: float = Field(10.0, gt=0)

    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/"
    amqp_exchange: str = "chatexport"
    amqp_queue: str = "chatexport.exports"
    amqp_delivery_limit: int = Field(20, ge=1)
    amqp_connect_timeout_seconds: float = Field(15.0, gt=0)
    amqp_heartbeat_seconds: int = Field(15, ge=1)

    s3_endpoint_url: str | None = "http://127.0.0.1:9000"
    s3_region: str = "us-east-1"
    s3_bucket: str = Field("chatexport-exports", min_length=3, max_length=63)
    # The janitor deletes what no live record names under it: it must name a folder of the service's own.
    s3_prefix: str = Field("exports/", pattern=r"^[^/].*/$")
    s3_access_key_id: str = "testing"
    s3_secret_access_key: str = "testing"
    s3_timeout_seconds: float = Field(20.0, gt=0)
    s3_part_size_bytes: int = Field(8 * 1024 * 1024, ge=5 * 1024 * 1024)

    jwt_secret: str = PLACEHOLDER_JWT_SECRET
    jwt_public_key: str | None = None
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    # Clock skew allowed between token issuers and the API, on iat, nbf and exp (README: API reference, Authentication).
    jwt_leeway_seconds: float = Field(30.0, ge=0, le=300)
    jwt_max_lifetime_seconds: int = Field(24 * 3600, ge=60)

    api_host: str = "127.0.0.1"
    api_port: int = Field(8080, ge=0, le=65535)

    message_body_max_bytes: int = Field(6, ge=1)
    message_request_max_bytes: int = Field(4096, ge=1)
    # The largest valid export request fits even with every character of its 100 senders and its notify URL
    # written as a \u escape (about 45 KiB; README: API reference, Export options).
    export_request_max_bytes: int = Field(64 * 1024, ge=1)
    import_request_max_bytes: int = Field(64 * 1024 * 1024, ge=1)
    import_body_max_bytes: int = Field(64 * 1024, ge=1)
    # A client that stops sending mid-body would otherwise hold its connection open with no answer.
    request_body_timeout_seconds: float = Field(30.0, gt=0)

    idempotency_replay_window_seconds: int = Field(24 * 3600, ge=1)
    operation_retention_seconds: int = Field(30 * 24 * 3600, ge=1)
    result_ttl_seconds: int = Field(7 * 24 * 3600, ge=1)
    max_active_exports: int = Field(5, ge=1)
    download_concurrency: int = Field(32, ge=1)
    download_per_user_concurrency: int = Field(4, ge=1)
    download_write_timeout_seconds: float = Field(30.0, gt=0)
    # A download slower than this over a whole window is cut, so a slow reader cannot hold a slot for hours.
    download_min_bytes_per_second: int = Field(4096, ge=1)
    download_rate_window_seconds: float = Field(30.0, gt=0)
    # Long polls and event streams waiting at once in one API process, and per user.
    wait_concurrency: int = Field(1000, ge=1)
    wait_per_user_concurrency: int = Field(10, ge=1)
    event_heartbeat_seconds: float = Field(15.0, gt=0)
    # Completion callbacks (README: API reference, Completion callbacks).
    webhook_signing_key: str = PLACEHOLDER_WEBHOOK_SIGNING_KEY
    webhook_previous_signing_key: str | None = None
    webhook_allow_private: bool = False
    webhook_timeout_seconds: float = Field(5.0, gt=0)
    webhook_retry_seconds: float = Field(24 * 3600.0, gt=0)
    webhook_first_retry_seconds: float = Field(5.0, gt=0)
    # An egress proxy every callback goes through, http://[user:password@]host:port; secret for its password.
    webhook_proxy_url: SecretStr | None = None

    lease_seconds: float = Field(30.0, gt=0)
    heartbeat_seconds: float = Field(10.0, gt=0)
    worker_concurrency: int = Field(4, ge=1)
    export_batch_rows: int = Field(20000, ge=1)
    retry_base_seconds: float = Field(2.0, gt=0)
    retry_cap_seconds: float = Field(300.0, gt=0)
    max_attempts: int = Field(5, ge=1)

    relay_batch_size: int = Field(100, ge=1)
    relay_poll_seconds: float = Field(1.0, gt=0)
    publish_timeout_seconds: float = Field(5.0, gt=0)

    janitor_interval_seconds: float = Field(30.0, gt=0)
    janitor_requeue_after_seconds: float = Field(60.0, gt=0)
    janitor_batch_size: int = Field(500, ge=1)
    janitor_orphan_grace_seconds: float = Field(900.0, ge=0)

    shutdown_grace_seconds: float = Field(20.0, ge=0)

    # Every part serves /metrics, /healthz and /readyz here; parts sharing a host need a port each.
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(9100, ge=0, le=65535)

    @model_validator(mode="after")
    def _check_consistency(self) -> Settings:
        if self.environment != "development" and self.jwt_public_key is None:
            if self.jwt_secret == PLACEHOLDER_JWT_SECRET:
                raise ValueError("CHATEXPORT_JWT_SECRET is the development placeholder; set a real secret")
            if len(self.jwt_secret.encode()) < MIN_JWT_SECRET_BYTES:
                # RFC 7518 3.2: an HS256 key must be at least as long as the hash output.
                raise ValueError(f"CHATEXPORT_JWT_SECRET must be at least {MIN_JWT_SECRET_BYTES} bytes")
        if self.environment != "development" and self.webhook_signing_key == PLACEHOLDER_WEBHOOK_SIGNING_KEY:
            raise ValueError("CHATEXPORT_WEBHOOK_SIGNING_KEY is the development placeholder; set a real key")
        if self.environment != "development" and self.webhook_allow_private:
            raise ValueError("CHATEXPORT_WEBHOOK_ALLOW_PRIVATE is for development and tests only")
        if self.webhook_proxy_url is not None and not _is_http_proxy(self.webhook_proxy_url.get_secret_value()):
            raise ValueError("CHATEXPORT_WEBHOOK_PROXY_URL must be http://[user:password@]host[:port]")
        if self.heartbeat_seconds >= self.lease_seconds:
            raise ValueError("CHATEXPORT_HEARTBEAT_SECONDS must be shorter than CHATEXPORT_LEASE_SECONDS")
        if self.result_ttl_seconds > self.operation_retention_seconds:
            raise ValueError("CHATEXPORT_RESULT_TTL_SECONDS must not exceed the operation retention")
        if self.idempotency_replay_window_seconds > self.operation_retention_seconds:
            raise ValueError("the idempotency replay window must not exceed the operation retention")
        return self


def _is_http_proxy(url: str) -> bool:
    # The proxy's host is read as a callback's is (an internal proxy is what it is for, so any address).
    try:
        parts = urlsplit(url)
        port = parts.port
        normalise_host(parts.hostname or "", bracketed=parts.netloc.rpartition("@")[2].startswith("["))
    except (RefusedTarget, ValueError):
        return False
    where = parts.path in ("", "/") and not (parts.query or parts.fragment)
    return parts.scheme == "http" and bool(parts.hostname) and port != 0 and where


def local_url(host: str, port: int) -> str:
    """``http://host:port`` for a client on the same machine as a server listening on ``host``: a wildcard
    listen address (``0.0.0.0``, ``::``, empty) is reached on loopback, and an IPv6 address is bracketed.
    """
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"
