"""Settings of every chatexport part, read from ``CHATEXPORT_*`` environment variables (docs/reference/settings.md:
Settings).

The settings come in groups, one class per concern (``GROUPS``: database, broker, storage, tokens, ...), and
each part builds only the groups it uses (``ApiPartSettings``, ...); ``Settings`` is all of them, for the
commands that are no part and for the tests. A group is no part of a setting's environment name, so a
deployment may give every part the same environment. Build the settings once in ``main()`` and pass them
down: nothing imports a global instance. A duration is declared with ``seconds`` and a size with ``size``.

The classes document themselves: the site's Settings page is generated from them (``devtools.reference``), a
section per group, so a setting is added here and nowhere else. Each field carries ``description=``
(markdown, a fragment without a final full stop: what the setting does and what refuses it). Its unit comes
from its name: a ``*_seconds`` setting is in seconds and a ``*_bytes`` one in bytes (``setting_unit``); any
other says, when a unit helps, ``json_schema_extra={"unit": ...}``: what the number counts (``connections``,
``B/s``, ...) or what the value is (``secret``, ``flag``, ``URL``). ``RULES`` is the page's prose above its tables.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.webhooks.targets import RefusedTarget, normalise_host

PLACEHOLDER_JWT_SECRET = "dev-only-insecure-secret-change-me"
PLACEHOLDER_WEBHOOK_SIGNING_KEY = "dev-only-insecure-webhook-key-change-me"
MIN_JWT_SECRET_BYTES = 32
# Also the connect timeout of code that runs without settings (migrations given a bare URL).
DATABASE_CONNECT_TIMEOUT_SECONDS = 10.0
# The shortest schedule interval outside development: an hour (docs/schedules.md: The resource).
DEFAULT_SCHEDULE_MIN_INTERVAL_SECONDS = 3600
# The most chunks of one plan, whatever CHATEXPORT_CHUNK_TARGET_BYTES says: each chunk becomes at most two parts of
# the assembled upload, which S3 allows 10,000 of (docs/chunks.md: The plan).
MAX_CHUNKS = 5000
# The largest quota of a rate limit: the largest Integer a Structured Field holds (RFC 9651 section 3.3.1), which
# the RateLimit fields show it as.
MAX_QUOTA = 999_999_999_999_999
# What a public key may verify (RFC 7518 3.1, RFC 8037): never an HS algorithm, whose key is a shared secret.
PUBLIC_KEY_ALGORITHMS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)

# Markdown; what ``Settings._check_consistency`` refuses, told before the table of every setting.
RULES = f"""Every setting is an environment variable, `CHATEXPORT_` followed by the setting's name; durations
are in seconds, sizes in bytes. Outside `development`, start-up refuses the placeholder JWT secret and any
secret shorter than {MIN_JWT_SECRET_BYTES} bytes (RFC 7518 3.2), unless a public key is configured; it also refuses
the placeholder webhook signing key, `CHATEXPORT_WEBHOOK_ALLOW_PRIVATE` and a schedule minimum interval below an
hour. The result retention and the
idempotency replay window may not exceed the record retention, and the heartbeat must be shorter than the
lease. Each part reads only the groups that name it below, and refuses only their bad values; the other commands
(`migrate`, `token`, `dev`, ...) read every group. A command given a bad value exits with code 2, naming the
setting on stderr but not its value."""


_CONFIG = SettingsConfigDict(env_prefix="CHATEXPORT_", extra="ignore")


def seconds(default: float | None, description: str, *, ge: float | None = None, le: float | None = None) -> Any:
    """A duration setting (its name ends in ``_seconds``, which gives the reference page its unit): above 0,
    or at least ``ge``, and at most ``le`` when given.
    """
    return Field(default, description=description, gt=0 if ge is None else None, ge=ge, le=le)


def size(default: int | None, description: str, *, ge: int = 1) -> Any:
    """A size setting in bytes (its name ends in ``_bytes``): at least ``ge``."""
    return Field(default, description=description, ge=ge)


class CommonSettings(BaseSettings):
    """What every part reads: its environment, its logging and its shutdown."""

    model_config = _CONFIG

    environment: Literal["development", "production"] = Field(
        "development",
        description="`development` or `production`; outside development the placeholder keys are refused (see above)",
    )

    log_level: str = Field("INFO", description="log level of every part (JSON lines on stderr)")

    shutdown_grace_seconds: float = seconds(20.0, "on SIGTERM, how long in-flight work may finish", ge=0)


class DatabaseSettings(BaseSettings):
    """PostgreSQL: the primary, the pool and its timeouts, and a standby for export reads."""

    model_config = _CONFIG

    database_url: str = Field(
        "postgresql://postgres@127.0.0.1:5432/chatexport",
        description="PostgreSQL DSN; a primary with standbys is named by all its hosts,"
        " `postgresql://user@h1:5432,h2:5432/chatexport?target_session_attrs=read-write`: each connection tries"
        " them in order and keeps the first that takes writes (see A primary with standbys on the Deployment page)",
        json_schema_extra={"unit": "URL"},
    )

    database_pool_max: int = Field(
        10, ge=1, description="pool size per process", json_schema_extra={"unit": "connections"}
    )

    database_timeout_seconds: float = seconds(10.0, "statement timeout (client side)")

    database_connect_timeout_seconds: float = seconds(
        DATABASE_CONNECT_TIMEOUT_SECONDS,
        "timeout of one connection attempt to one host of `database_url`; hosts are tried in turn,"
        " each with this timeout",
    )

    database_read_url: str | None = Field(
        None,
        description="DSN of a hot standby for the worker's reads of an export's messages; unset: every read"
        " goes to `database_url`. Membership checks and writes always go to `database_url`",
        json_schema_extra={"unit": "URL"},
    )

    database_read_wait_seconds: float = seconds(
        2.0,
        "how long an attempt or chunk waits for the standby to replay past its claim before it"
        " reads from the primary instead",
        ge=0,
    )


class BrokerSettings(BaseSettings):
    """RabbitMQ: its nodes, the work exchange and queue, and the connection's timeouts."""

    model_config = _CONFIG

    amqp_url: str = Field(
        "amqp://guest:guest@127.0.0.1:5672/",
        description="RabbitMQ URL, or the URLs of a cluster's nodes separated by commas (each `amqp://` or"
        " `amqps://`): a part connects to the first node that answers and, when its node goes, to the next",
        json_schema_extra={"unit": "URL"},
    )

    amqp_exchange: str = Field(
        "chatexport", description="work exchange (direct); its dead-letter exchange is `<name>.dlx`"
    )

    amqp_queue: str = Field("chatexport.exports", description="work queue (quorum); dead letters go to `<name>.dead`")

    amqp_delivery_limit: int = Field(
        20, ge=1, description="`x-delivery-limit` of the work queue", json_schema_extra={"unit": "deliveries"}
    )

    amqp_connect_timeout_seconds: float = seconds(
        15.0,
        "timeout of one broker connection attempt (to one node); parts retry with backoff until the broker answers",
    )

    amqp_quorum_initial_group_size: int | None = Field(
        None,
        ge=1,
        description="`x-quorum-initial-group-size` of the work, chunk and dead-letter queues: on how many nodes"
        " they keep replicas; unset: the argument is left out (RabbitMQ then uses every node of the cluster at"
        " declaration). RabbitMQ refuses to redeclare an existing queue with another value: see Broker clusters"
        " on the Deployment page before changing it",
        json_schema_extra={"unit": "nodes"},
    )

    # Member lists of quorum queues are not visible over AMQP, only through the management plugin's HTTP API.
    amqp_management_url: SecretStr | None = Field(
        None,
        description="RabbitMQ management API, `http[s]://user:password@host:port/`; when set, the worker checks"
        " that the work queue has `CHATEXPORT_AMQP_QUORUM_INITIAL_GROUP_SIZE` members and exports the count;"
        " the credentials are never logged",
        json_schema_extra={"unit": "URL"},
    )

    amqp_heartbeat_seconds: int = seconds(
        15,
        "AMQP heartbeat interval asked of the broker; a broker that hangs without closing the"
        " connection is noticed after two or three (readiness 503, then a reconnect)",
        ge=1,
    )

    @model_validator(mode="after")
    def _check_broker_urls(self) -> BrokerSettings:
        if not all(_is_url(url, ("amqp", "amqps")) for url in amqp_node_urls(self.amqp_url)):
            # Not the value itself: it holds the broker's password.
            raise ValueError("CHATEXPORT_AMQP_URL must be amqp:// or amqps:// URLs separated by commas")
        if self.amqp_management_url is not None and not _is_url(
            self.amqp_management_url.get_secret_value(), ("http", "https")
        ):
            raise ValueError("CHATEXPORT_AMQP_MANAGEMENT_URL must be an http:// or https:// URL")
        return self


class StorageSettings(BaseSettings):
    """S3: where export files are stored, and how long a request to it may take."""

    model_config = _CONFIG

    s3_endpoint_url: str | None = Field(
        "http://127.0.0.1:9000",
        description="S3 endpoint; `make run` starts moto here if nothing answers. Empty: AWS S3's own endpoint"
        " for `s3_region`",
    )

    s3_region: str = Field("us-east-1", description="S3 region")

    s3_public_endpoint_url: str | None = Field(
        None,
        description="S3 endpoint that download redirects' presigned URLs name, as clients reach it; unset or"
        " empty: `s3_endpoint_url`",
    )

    s3_bucket: str = Field(
        "chatexport-exports",
        min_length=3,
        max_length=63,
        description="bucket of the export files (3-63 characters); created on start-up if missing",
    )

    # The janitor deletes what no live record names under it: it must name a folder of the service's own.
    s3_prefix: str = Field(
        "exports/",
        pattern=r"^[^/].*/$",
        description="key prefix; files are `<prefix><operation>/g<generation>.<format>[.gz]`. A folder: it must"
        " end with `/` and not start with one. The janitor deletes old objects under it that no record names,"
        " so give the service a folder (or bucket) of its own",
    )

    # The janitor reconciles what is under it with the attachment records: a folder of its own too.
    s3_attachment_prefix: str = Field(
        "attachments/",
        pattern=r"^[^/].*/$",
        description="key prefix of attachments, `<prefix><attachment id>`; a folder like `s3_prefix`, neither"
        " of them inside the other (the previous release's janitor sweeps `s3_prefix` only)",
    )

    s3_access_key_id: str = Field("testing", description="S3 credentials")

    s3_secret_access_key: str = Field("testing", description="S3 credentials")

    s3_timeout_seconds: float = seconds(
        20.0,
        "S3 connect and read timeout; an upload request may take this long plus its size at 256"
        " KiB/s, then counts as a storage failure (a server that accepts the connection and stops"
        " reading would otherwise hold it)",
    )

    s3_part_size_bytes: int = size(
        8 * 1024 * 1024, "multipart part size (at least 5 MiB); bounds the worker's memory", ge=5 * 1024 * 1024
    )

    @field_validator("s3_endpoint_url", "s3_public_endpoint_url", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        # An environment variable cannot be unset by a manifest that merges another over it: empty means none.
        return None if value == "" else value

    @model_validator(mode="after")
    def _check_prefixes(self) -> StorageSettings:
        # Each prefix's sweep deletes what its own records do not name: one inside the other would delete
        # the other's objects.
        if self.s3_prefix.startswith(self.s3_attachment_prefix) or self.s3_attachment_prefix.startswith(self.s3_prefix):
            raise ValueError("s3_prefix and s3_attachment_prefix must be separate folders, neither inside the other")
        return self


class TokenSettings(BaseSettings):
    """How the API verifies bearer tokens: one source of keys (the HS256 secret by default, static public keys,
    a JWKS URL, or OIDC discovery), the algorithms, the claims required, and the JWKS cache."""

    model_config = _CONFIG

    jwt_secret: str = Field(
        PLACEHOLDER_JWT_SECRET,
        description="HS256 secret for verifying (and, in development, minting) tokens; the key source when no"
        " other is set",
    )

    jwt_public_key: str | None = Field(
        None, description="a PEM public key; when set, tokens are verified with it instead (one static key)"
    )

    jwt_key_files: str | None = Field(
        None,
        description="static public keys: paths of PEM files or of a JWKS file (`.json`), separated by commas,"
        " so that two keys can overlap during a rotation; read at start-up",
    )

    jwt_jwks_url: str | None = Field(
        None,
        description="the identity provider's JWKS URL (https; http only to a loopback host in `development`):"
        " its keys are fetched at start-up and kept fresh (see Connect your identity provider)",
        json_schema_extra={"unit": "URL"},
    )

    jwt_oidc_discovery: bool = Field(
        False,
        description="read the JWKS URL from `CHATEXPORT_JWT_ISSUER`'s `/.well-known/openid-configuration`, whose"
        " `issuer` must equal it",
        json_schema_extra={"unit": "flag"},
    )

    jwt_algorithms: str = Field(
        "RS256,ES256,EdDSA",
        description="the algorithms a public key may verify, separated by commas (RS256/384/512, PS256/384/512,"
        " ES256/384/512, EdDSA); never an HS algorithm, which only the secret verifies",
    )

    jwt_issuer: str | None = Field(None, description="required `iss`, when set; required with OIDC discovery")

    jwt_audience: str | None = Field(None, description="required `aud`, when set: a token without `aud` is refused")

    jwt_authorized_parties: str | None = Field(
        None, description="when set, the `azp` values accepted, separated by commas: a token without `azp` is refused"
    )

    jwt_user_claim: str = Field("sub", description="the claim that names the user")

    jwt_admin_claim: str = Field(
        "scope",
        description="the claim that grants the admin role, a path with dots into nested objects"
        " (`realm_access.roles`): a string of names separated by spaces, or a list of names",
    )

    jwt_admin_value: str = Field("admin", description="the name in `CHATEXPORT_JWT_ADMIN_CLAIM` that grants it")

    # Clock skew allowed between token issuers and the API, on iat, nbf and exp (docs/api.md: Tokens and keys,
    # Authentication).
    jwt_leeway_seconds: float = seconds(30.0, "clock skew allowed on `iat`, `nbf` and `exp` (0-300)", ge=0, le=300)

    jwt_max_lifetime_seconds: int = seconds(
        24 * 3600, "a token whose `exp` is further ahead (plus the leeway) is refused", ge=60
    )

    jwks_min_cache_seconds: float = seconds(60.0, "the shortest a fetched JWKS is kept, whatever its `max-age`")

    jwks_max_cache_seconds: float = seconds(24 * 3600.0, "the longest a fetched JWKS is kept before a refresh")

    jwks_default_cache_seconds: float = seconds(600.0, "how long a JWKS without `Cache-Control: max-age` is kept")

    jwks_unknown_kid_cooldown_seconds: float = seconds(
        30.0, "after a fetch for an unknown `kid`, how long before another: unknown `kid`s cost nothing meanwhile"
    )

    jwks_max_stale_seconds: float = seconds(
        24 * 3600.0, "while the JWKS cannot be fetched, how long its last keys keep verifying"
    )

    jwks_fetch_timeout_seconds: float = seconds(10.0, "the deadline of one fetch of the JWKS or discovery document")

    @model_validator(mode="after")
    def _check_keys(self) -> TokenSettings:
        sources = [self.jwt_public_key, self.jwt_key_files, self.jwt_jwks_url or self.jwt_oidc_discovery or None]
        if sum(source is not None for source in sources) > 1:
            raise ValueError(
                "set one key source: CHATEXPORT_JWT_PUBLIC_KEY, CHATEXPORT_JWT_KEY_FILES, CHATEXPORT_JWT_JWKS_URL"
                " or CHATEXPORT_JWT_OIDC_DISCOVERY"
            )
        if self.jwt_oidc_discovery and (self.jwt_jwks_url or not self.jwt_issuer):
            raise ValueError("CHATEXPORT_JWT_OIDC_DISCOVERY reads the JWKS URL from CHATEXPORT_JWT_ISSUER alone")
        for name, url in (("JWKS_URL", self.jwt_jwks_url), ("ISSUER", self.remote_issuer)):
            if url is not None and not is_remote_key_url(url, development=not outside_development(self)):
                raise ValueError(f"CHATEXPORT_JWT_{name} must be https:// (http:// to a loopback host in development)")
        algorithms = self.public_key_algorithms
        if not algorithms or not set(algorithms) <= PUBLIC_KEY_ALGORITHMS:
            raise ValueError(f"CHATEXPORT_JWT_ALGORITHMS must name some of {', '.join(sorted(PUBLIC_KEY_ALGORITHMS))}")
        if self.jwks_min_cache_seconds > self.jwks_max_cache_seconds:
            raise ValueError("CHATEXPORT_JWKS_MIN_CACHE_SECONDS must not exceed CHATEXPORT_JWKS_MAX_CACHE_SECONDS")
        if outside_development(self) and not self.uses_public_keys:
            if self.jwt_secret == PLACEHOLDER_JWT_SECRET:
                raise ValueError("CHATEXPORT_JWT_SECRET is the development placeholder; set a real secret")
            if len(self.jwt_secret.encode()) < MIN_JWT_SECRET_BYTES:
                # RFC 7518 3.2: an HS256 key must be at least as long as the hash output.
                raise ValueError(f"CHATEXPORT_JWT_SECRET must be at least {MIN_JWT_SECRET_BYTES} bytes")
        return self

    @property
    def uses_public_keys(self) -> bool:
        """True when tokens are verified with public keys (static or fetched), not the HS256 secret."""
        return bool(self.jwt_public_key or self.jwt_key_files or self.jwt_jwks_url or self.jwt_oidc_discovery)

    @property
    def remote_issuer(self) -> str | None:
        """The issuer whose discovery document names the JWKS URL, when OIDC discovery is on."""
        return self.jwt_issuer if self.jwt_oidc_discovery else None

    @property
    def public_key_algorithms(self) -> list[str]:
        """``jwt_algorithms`` as a list, in order."""
        return _comma_list(self.jwt_algorithms)

    @property
    def authorized_parties(self) -> frozenset[str] | None:
        """``jwt_authorized_parties`` as a set; None when any ``azp`` (or none) is accepted."""
        return None if self.jwt_authorized_parties is None else frozenset(_comma_list(self.jwt_authorized_parties))


class HttpSettings(BaseSettings):
    """The API's listener and the limits of a request to it."""

    model_config = _CONFIG

    api_host: str = Field("127.0.0.1", description="API listen address")

    api_port: int = Field(8080, ge=0, le=65535, description="API listen port")

    api_socket_fd: int | None = Field(
        None,
        ge=0,
        description="serve the API on this inherited listening socket (a file descriptor) instead of binding"
        " `api_host:api_port`: a supervisor that holds the port across restarts hands it over",
    )

    message_body_max_bytes: int = size(
        6,
        "largest message body on `POST /v2/.../messages` (UTF-8; 6 is the message store contract's"
        " own default, imports have their own limit)",
    )

    message_request_max_bytes: int = size(4096, "largest request body on `POST /v2/.../messages`")

    attachment_max_bytes: int = size(
        100 * 1024 * 1024, "largest attachment on `POST /v2/conversations/{cid}/attachments`"
    )

    # Each upload holds up to two S3 parts in memory (docs/api.md: Message store, Attachments).
    upload_concurrency: int = Field(
        16,
        ge=1,
        description="attachment uploads one API process takes at once, each holding up to two S3 parts in"
        " memory; `503` beyond",
        json_schema_extra={"unit": "uploads"},
    )

    upload_per_user_concurrency: int = Field(
        2,
        ge=1,
        description="attachment uploads one user may have open in one API process; `429 TOO_MANY_UPLOADS` beyond",
        json_schema_extra={"unit": "uploads"},
    )

    # The largest valid export request fits even with every character of its 100 senders and its notify URL
    # written as a \u escape (about 45 KiB; docs/api.md: Submitting an export, Export options).
    export_request_max_bytes: int = size(
        64 * 1024,
        "largest request body on export submit and cancel; the default fits the largest valid submit"
        " (100 senders of 64 characters and a notify URL, even with every character `\\u`-escaped)",
    )

    import_request_max_bytes: int = size(64 * 1024 * 1024, "largest NDJSON import request")

    import_body_max_bytes: int = size(64 * 1024, "largest imported message body")

    # A client that trickles its request line and headers would otherwise hold its connection, without a token,
    # for the whole keep-alive timeout (docs/security.md: Slow clients).
    request_header_timeout_seconds: float = seconds(
        10.0,
        "a request line and header fields not complete this long after the request's first byte"
        " arrived close the connection without an answer",
    )

    # A client that stops sending mid-body would otherwise hold its connection open with no answer.
    request_body_timeout_seconds: float = seconds(
        30.0,
        "a request body not complete this long after its route began reading it is `408"
        " REQUEST_TIMEOUT`, and the connection is closed",
    )


class ExportSettings(BaseSettings):
    """How long records, keys and results are kept, and how many exports a user may run at once."""

    model_config = _CONFIG

    idempotency_replay_window_seconds: int = seconds(24 * 3600, "replay window of an Idempotency-Key", ge=1)

    operation_retention_seconds: int = seconds(
        30 * 24 * 3600, "how long operation records (and their keys) are kept", ge=1
    )

    result_ttl_seconds: int = seconds(7 * 24 * 3600, "how long a result can be downloaded", ge=1)

    max_active_exports: int = Field(
        5, ge=1, description="non-terminal exports per user before `429`", json_schema_extra={"unit": "operations"}
    )

    @model_validator(mode="after")
    def _check_retention(self) -> ExportSettings:
        if self.result_ttl_seconds > self.operation_retention_seconds:
            raise ValueError("CHATEXPORT_RESULT_TTL_SECONDS must not exceed the operation retention")
        if self.idempotency_replay_window_seconds > self.operation_retention_seconds:
            raise ValueError("the idempotency replay window must not exceed the operation retention")
        return self


class ScheduleSettings(BaseSettings):
    """Export schedules: their shortest interval, how many a user may have, how often due ones are fired."""

    model_config = _CONFIG

    schedule_min_interval_seconds: int = seconds(
        DEFAULT_SCHEDULE_MIN_INTERVAL_SECONDS,
        "the shortest interval a schedule may have (its `every`, a month counting as 28 days); below"
        f" {DEFAULT_SCHEDULE_MIN_INTERVAL_SECONDS} for development and tests only (refused elsewhere)",
        ge=1,
    )

    max_schedules_per_user: int = Field(
        20, ge=1, description="export schedules per user before `409`", json_schema_extra={"unit": "schedules"}
    )

    scheduler_interval_seconds: float = seconds(
        1.0, "how often the leading janitor looks for due schedules and creates their runs"
    )

    @model_validator(mode="after")
    def _check_min_interval(self) -> ScheduleSettings:
        if outside_development(self) and self.schedule_min_interval_seconds < DEFAULT_SCHEDULE_MIN_INTERVAL_SECONDS:
            raise ValueError(
                "CHATEXPORT_SCHEDULE_MIN_INTERVAL_SECONDS below "
                f"{DEFAULT_SCHEDULE_MIN_INTERVAL_SECONDS} is for development and tests only"
            )
        return self


class DownloadSettings(BaseSettings):
    """Downloads of results: how many at once, and how slow a reader may be."""

    model_config = _CONFIG

    download_concurrency: int = Field(
        32,
        ge=1,
        description="downloads one API process streams at once; `503` beyond",
        json_schema_extra={"unit": "downloads"},
    )

    download_per_user_concurrency: int = Field(
        4,
        ge=1,
        description="downloads one user may have open in one API process; `429 TOO_MANY_DOWNLOADS` beyond",
        json_schema_extra={"unit": "downloads"},
    )

    download_redirect_seconds: int = seconds(
        60,
        "lifetime of the presigned storage URL a download redirect answers with (at most S3's 7 days)",
        ge=1,
        le=604800,
    )

    download_write_timeout_seconds: float = seconds(
        30.0, "a download client that accepts no data this long is disconnected"
    )

    # A download slower than this over a whole window is cut, so a slow reader cannot hold a slot for hours.
    download_min_bytes_per_second: int = Field(
        4096,
        ge=1,
        description="a download moving less over a whole rate window is cut off",
        json_schema_extra={"unit": "B/s"},
    )

    download_rate_window_seconds: float = seconds(30.0, "the window over which a download's rate is judged")


class WaitSettings(BaseSettings):
    """Long polls and event streams: how many at once, and how often a stream says it is alive."""

    model_config = _CONFIG

    # Long polls and event streams waiting at once in one API process, and per user.
    wait_concurrency: int = Field(
        1000,
        ge=1,
        description="long polls and event streams one API process holds at once; `503` beyond",
        json_schema_extra={"unit": "requests"},
    )

    wait_per_user_concurrency: int = Field(
        10,
        ge=1,
        description="long polls and event streams one user may have waiting in one API process; `429"
        " TOO_MANY_WAITERS` beyond",
        json_schema_extra={"unit": "requests"},
    )

    event_heartbeat_seconds: float = seconds(15.0, "the interval of an event stream's heartbeat comments")


class RateLimitSettings(BaseSettings):
    """Each user's rate limits and storage budget, the fields that announce them, and what the limiter does when
    its store fails (docs/api.md: Rate limits)."""

    model_config = _CONFIG

    rate_limit_submits: int = Field(
        100,
        ge=1,
        le=MAX_QUOTA,
        description="exports one user may submit per `CHATEXPORT_RATE_LIMIT_SUBMITS_WINDOW_SECONDS`, counted"
        " exactly across every API process; `429 RATE_LIMITED` beyond (a replay counts nothing)",
        json_schema_extra={"unit": "requests"},
    )

    rate_limit_submits_window_seconds: int = Field(
        3600, ge=1, le=86400, description="the window of `CHATEXPORT_RATE_LIMIT_SUBMITS`"
    )

    rate_limit_polls: int = Field(
        600,
        ge=1,
        le=MAX_QUOTA,
        description="reads of operations (a poll, a long poll, an event stream's opening, the list, `GET"
        " /v3/limits`) one user may make per `CHATEXPORT_RATE_LIMIT_POLLS_WINDOW_SECONDS`; `429 RATE_LIMITED`"
        " beyond",
        json_schema_extra={"unit": "requests"},
    )

    rate_limit_polls_window_seconds: int = Field(
        60, ge=1, le=86400, description="the window of `CHATEXPORT_RATE_LIMIT_POLLS`"
    )

    rate_limit_downloads: int = Field(
        100,
        ge=1,
        le=MAX_QUOTA,
        description="downloads of results (whole or a part, served or redirected) one user may start per"
        " `CHATEXPORT_RATE_LIMIT_DOWNLOADS_WINDOW_SECONDS`; `429 RATE_LIMITED` beyond",
        json_schema_extra={"unit": "requests"},
    )

    rate_limit_downloads_window_seconds: int = Field(
        3600, ge=1, le=86400, description="the window of `CHATEXPORT_RATE_LIMIT_DOWNLOADS`"
    )

    rate_limit_content_bytes: int = Field(
        10 * 1024**3,
        ge=1,
        le=MAX_QUOTA,
        description="the bytes one user may hold in results not yet expired plus exports being written; a"
        " submit once they are spent is `429 CONTENT_BYTES_SPENT`",
    )

    rate_limit_batch: int = Field(
        20,
        ge=1,
        description="polls and downloads an API process takes from a user's allowance in one statement and"
        " grants locally: a user may go over a policy by at most one batch per API process in a window",
        json_schema_extra={"unit": "requests"},
    )

    rate_limit_admin_exempt: bool = Field(
        True,
        description="tokens with the `admin` scope are counted by no policy",
        json_schema_extra={"unit": "flag"},
    )

    rate_limit_fields: bool = Field(
        True,
        description="answers carry the `RateLimit-Policy` and `RateLimit` fields; the limits hold either way",
        json_schema_extra={"unit": "flag"},
    )

    rate_limit_on_store_failure: Literal["open", "closed"] = Field(
        "open",
        description="what a poll or a download gets when the limiter's statement fails or times out: `open`"
        " lets it through, `closed` answers `503` (a submit is counted in its own statement either way)",
    )

    rate_limit_timeout_seconds: float = seconds(
        0.5, "the limiter's own deadline: waiting for a connection of its pool and running its statement"
    )

    rate_limit_pool_max: int = Field(
        2,
        ge=1,
        description="connections of the limiter's own pool in one API process, apart from the API's pool",
        json_schema_extra={"unit": "connections"},
    )

    rate_limit_partition_key: str | None = Field(
        None,
        description="the key of the HMAC that makes a field's `pk` from a user id; by default one derived from"
        " `CHATEXPORT_WEBHOOK_SIGNING_KEY`",
        json_schema_extra={"unit": "secret"},
    )


class WebhookSettings(BaseSettings):
    """Completion callbacks: their signing keys, which receivers they may reach, their timeouts and retries."""

    model_config = _CONFIG

    # Completion callbacks (docs/api.md: Completion callbacks).
    webhook_signing_key: str = Field(
        PLACEHOLDER_WEBHOOK_SIGNING_KEY,
        description="the deployment key every user's callback secret is derived from; refused outside"
        " `development` while it is the placeholder",
        json_schema_extra={"unit": "secret"},
    )

    webhook_previous_signing_key: str | None = Field(
        None,
        description="during a key rotation, the previous key: callbacks carry a second signature made with it",
        json_schema_extra={"unit": "secret"},
    )

    webhook_allow_private: bool = Field(
        False,
        description="for development and tests only (refused elsewhere): callbacks may go to http URLs and"
        " private addresses",
        json_schema_extra={"unit": "flag"},
    )

    webhook_timeout_seconds: float = seconds(
        5.0,
        "the one deadline of a callback attempt, from resolving its host through the TLS handshake to"
        " the last byte read",
    )

    webhook_retry_seconds: float = seconds(
        24 * 3600.0, "how long after its event a callback is retried before it is given up"
    )

    webhook_first_retry_seconds: float = seconds(
        5.0,
        "the longest wait before a failed callback's first retry (the wait is drawn from half of it"
        " to all of it and doubles with each try, at most an hour)",
    )

    # An egress proxy every callback goes through, http://[user:password@]host:port; secret for its password.
    webhook_proxy_url: SecretStr | None = Field(
        None,
        description="an egress proxy every callback goes through, `http://[user:password@]host[:port]`: the relay"
        " asks it for each host with `CONNECT` and its rules decide (see Completion callbacks); the"
        " credentials are never logged",
        json_schema_extra={"unit": "URL"},
    )

    @model_validator(mode="after")
    def _check_webhooks(self) -> WebhookSettings:
        if outside_development(self) and self.webhook_signing_key == PLACEHOLDER_WEBHOOK_SIGNING_KEY:
            raise ValueError("CHATEXPORT_WEBHOOK_SIGNING_KEY is the development placeholder; set a real key")
        if outside_development(self) and self.webhook_allow_private:
            raise ValueError("CHATEXPORT_WEBHOOK_ALLOW_PRIVATE is for development and tests only")
        if self.webhook_proxy_url is not None and not _is_http_proxy(self.webhook_proxy_url.get_secret_value()):
            raise ValueError("CHATEXPORT_WEBHOOK_PROXY_URL must be http://[user:password@]host[:port]")
        return self


class LeaseSettings(BaseSettings):
    """Leases: an operation's length, the heartbeat of every lease (an operation's, a chunk's, a batch of
    callbacks'), how much a worker runs at once, and an operation's attempts."""

    model_config = _CONFIG

    lease_seconds: float = seconds(30.0, "worker lease length (database clock)")

    heartbeat_seconds: float = seconds(
        10.0, "renewal interval of every lease (an export's, a chunk's, a batch of callbacks'); shorter than the lease"
    )

    worker_concurrency: int = Field(
        4,
        ge=1,
        description="exports one worker process runs at once (and its prefetch)",
        json_schema_extra={"unit": "exports"},
    )

    export_batch_rows: int = Field(
        20000,
        ge=1,
        description="the most seqs read at once, by the two statements that read the next ranges together (half"
        " each); each range is held in memory until handed to the upload, so ranges are sized from the previous"
        " range's bytes per seq to about half a part (the first ones are 1,000 seqs); cancellation and lease"
        " loss are noticed between ranges",
        json_schema_extra={"unit": "seqs"},
    )

    retry_base_seconds: float = seconds(2.0, "first retry delay (exponential backoff with jitter)")

    retry_cap_seconds: float = seconds(300.0, "largest retry delay")

    max_attempts: int = Field(
        5, ge=1, description="attempt budget before FAILED_REPAIR", json_schema_extra={"unit": "attempts"}
    )

    @model_validator(mode="after")
    def _check_heartbeat(self) -> LeaseSettings:
        if self.heartbeat_seconds >= self.lease_seconds:
            raise ValueError("CHATEXPORT_HEARTBEAT_SECONDS must be shorter than CHATEXPORT_LEASE_SECONDS")
        return self


class ChunkSettings(BaseSettings):
    """Chunked exports: when an export is chunked, how big a chunk is, and how many run at once."""

    model_config = _CONFIG

    # Chunked exports (docs/chunks.md: Chunked exports). Below the threshold one worker writes the file in about
    # ten seconds (a 200 MB export takes 9 s here), less than planning, assembling and reading the file back
    # for its digest would save.
    chunk_threshold_bytes: int = size(
        256 * 1024 * 1024,
        "an export whose messages are estimated above this size is written in chunks by many workers;"
        " `0` turns chunking off",
        ge=0,
    )

    chunk_target_bytes: int = size(
        64 * 1024 * 1024,
        f"the estimated size of one chunk (more, when an export would otherwise have over {MAX_CHUNKS:,} chunks)",
    )

    chunks_per_export: int = Field(
        4, ge=1, description="the most chunks of one export that run at once", json_schema_extra={"unit": "chunks"}
    )

    worker_chunk_concurrency: int = Field(
        2,
        ge=1,
        description="chunks one worker process runs at once, besides its `CHATEXPORT_WORKER_CONCURRENCY` exports"
        " (so that a small export never waits behind chunks)",
        json_schema_extra={"unit": "chunks"},
    )


class RelaySettings(BaseSettings):
    """The relay: how many outbox rows it claims at once, how often it looks, how long a publish may take."""

    model_config = _CONFIG

    relay_batch_size: int = Field(
        100, ge=1, description="outbox rows claimed per relay transaction", json_schema_extra={"unit": "rows"}
    )

    relay_poll_seconds: float = seconds(1.0, "relay polling interval besides LISTEN/NOTIFY")

    relay_linger_seconds: float = seconds(
        0.02,
        "after a round of batches during which more outbox rows were announced, time from that round's start "
        "until the relay claims again, so that rows arriving under load go out in fewer, larger batches; a row "
        "announced to an idle relay goes out at once (0: never wait)",
        ge=0,
    )

    publish_timeout_seconds: float = seconds(5.0, "timeout of one publish, confirm included")


class JanitorSettings(BaseSettings):
    """The janitor: how often it passes, when it requeues stranded work and removes orphans."""

    model_config = _CONFIG

    janitor_interval_seconds: float = seconds(30.0, "time between janitor passes")

    janitor_requeue_after_seconds: float = seconds(
        60.0,
        "a QUEUED operation, a due retry or an expired lease whose last wake-up is this old gets a"
        " new one (an expired lease also at once when its last wake-up predates the expiry)",
    )

    janitor_batch_size: int = Field(
        500,
        ge=1,
        description="operations handled per step of a pass, and objects and uploads listed per pass",
        json_schema_extra={"unit": "rows"},
    )

    janitor_orphan_grace_seconds: float = seconds(
        900.0,
        "age before an unpublishable artifact (by its record's last change), an object without a live"
        " record (by LastModified) or a stale upload (by Initiated) is removed",
        ge=0,
    )


class KubernetesSettings(BaseSettings):
    """On Kubernetes: the worker's pod, whose deletion cost it keeps current so that a scale-down removes idle
    workers first (docs/kubernetes.md: Stopping and scaling down); off unless the pod's name is given."""

    model_config = _CONFIG

    kubernetes_pod_name: str | None = Field(
        None,
        description="the worker's pod (from the downward API); when set, the worker keeps the pod's"
        " `controller.kubernetes.io/pod-deletion-cost` annotation current, which needs RBAC to patch it",
    )

    kubernetes_namespace: str | None = Field(None, description="the pod's namespace (from the downward API)")

    kubernetes_api_url: str = Field(
        "https://kubernetes.default.svc",
        description="the Kubernetes API, as a pod reaches it",
        json_schema_extra={"unit": "URL"},
    )

    kubernetes_service_account_dir: str = Field(
        "/var/run/secrets/kubernetes.io/serviceaccount",
        description="where the pod's service account token (`token`) and the API's CA (`ca.crt`) are mounted",
    )

    pod_deletion_cost_interval_seconds: float = seconds(
        5.0, "how often the worker brings its pod's deletion cost up to date"
    )


class MonitoringSettings(BaseSettings):
    """Every part's monitoring endpoint (/metrics, /healthz, /readyz)."""

    model_config = _CONFIG

    # Every part serves /metrics, /healthz and /readyz here; parts sharing a host need a port each.
    metrics_host: str = Field(
        "127.0.0.1",
        description="address of each part's monitoring endpoint (`/metrics`, `/healthz`, `/readyz`); `0.0.0.0` in"
        " a container",
    )

    metrics_port: int = Field(
        9100,
        ge=0,
        le=65535,
        description="its port; parts sharing a host need one each (`make run` gives api, relay, workers, janitor"
        " consecutive ports from this one); `0` picks a free port and logs it",
    )

    metrics_socket_fd: int | None = Field(
        None,
        ge=0,
        description="serve the monitoring endpoint on this inherited listening socket (a file descriptor) instead"
        " of binding `metrics_host:metrics_port`, as `api_socket_fd` does for the API",
    )


def outside_development(group: BaseSettings) -> bool:
    """Whether ``group`` belongs to settings of another environment than ``development``: a group's rules that
    depend on the environment read it from ``CommonSettings``, which every part's settings hold (a group built
    alone counts as development).
    """
    return isinstance(group, CommonSettings) and group.environment != "development"


class PartSettings(MonitoringSettings, DatabaseSettings, CommonSettings):
    """What every part builds: its environment, its database and its monitoring endpoint."""


class ApiPartSettings(
    RateLimitSettings,
    WebhookSettings,
    WaitSettings,
    DownloadSettings,
    ScheduleSettings,
    ExportSettings,
    HttpSettings,
    TokenSettings,
    StorageSettings,
    PartSettings,
):
    """The groups the API builds (``chatexport api``)."""


class RelayPartSettings(LeaseSettings, RelaySettings, WebhookSettings, BrokerSettings, PartSettings):
    """The groups the relay builds (``chatexport relay``): the outbox, the broker, completion callbacks and
    their lease's heartbeat."""


class WorkerPartSettings(
    KubernetesSettings,
    JanitorSettings,
    ChunkSettings,
    LeaseSettings,
    ExportSettings,
    HttpSettings,
    StorageSettings,
    BrokerSettings,
    PartSettings,
):
    """The groups a worker builds (``chatexport worker``)."""


class JanitorPartSettings(JanitorSettings, ScheduleSettings, ExportSettings, StorageSettings, PartSettings):
    """The groups the janitor builds (``chatexport janitor``)."""


# pydantic's mypy plugin gives each part its own ``model_construct`` signature and then finds the four
# incompatible; the classes' method resolution order is consistent (every part lists its groups in one order).
class Settings(JanitorPartSettings, WorkerPartSettings, RelayPartSettings, ApiPartSettings):  # type: ignore[misc]
    """Typed configuration of every part: every group, each read from its own ``CHATEXPORT_<name>`` variables
    (the names stay flat: a group is no part of them); durations are in seconds, sizes in bytes. The
    commands that are no part (``migrate``, ``token``, ``dev``, ...) and the tests build it; a part builds
    only its own groups (``ApiPartSettings``, ...), of which this is a subclass.

    Raises ``pydantic.ValidationError`` on a bad value; each group refuses what its own rules forbid
    (docs/reference/settings.md: Settings).
    """


# The groups in the order the Settings page shows them, which is the order of ``Settings.model_fields``: each
# class that declares settings of its own, base first.
GROUPS: tuple[type[BaseSettings], ...] = tuple(
    group for group in reversed(Settings.__mro__) if BaseSettings in group.__bases__
)


def amqp_node_urls(amqp_url: str) -> list[str]:
    """The node URLs of ``CHATEXPORT_AMQP_URL`` (one URL, or several separated by commas), in order, each
    stripped of surrounding spaces; an empty part stays an empty string (which the settings refuse).
    """
    return [url.strip() for url in amqp_url.split(",")]


def _is_url(url: str, schemes: tuple[str, ...]) -> bool:
    """Whether ``url`` has one of ``schemes``, a host and a valid port (or none)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - reading it raises ValueError on a bad port
    except ValueError:
        return False
    return parts.scheme in schemes and bool(parts.hostname)


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


def is_remote_key_url(url: str, *, development: bool) -> bool:
    """Whether keys may be fetched from ``url``: https with a host, or http to a loopback host (``localhost``,
    127.0.0.0/8, ``::1``) in development (docs/keys.md: Connect your identity provider).
    """
    if not _is_url(url, ("http", "https")):
        return False
    parts = urlsplit(url)
    if parts.scheme == "https":
        return True
    host = parts.hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    return development and loopback


def _comma_list(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def local_url(host: str, port: int) -> str:
    """``http://host:port`` for a client on the same machine as a server listening on ``host``: a wildcard
    listen address (``0.0.0.0``, ``::``, empty) is reached on loopback, and an IPv6 address is bracketed.
    """
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"
