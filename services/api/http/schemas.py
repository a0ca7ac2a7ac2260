"""Request and response models of the public API.

Request models are strict, so that ``"9"``, ``1e3`` and ``true`` are not integers. Response models describe
what the views answer; they are the source of the OpenAPI document's component schemas
(``services.api.openapi``), and the end-to-end conformance test holds the views to them.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonDict, SkipJsonSchema
from pydantic_core import PydanticCustomError

from shared.export.formats import (
    COMPRESSIONS,
    CONTENT_TYPES,
    DEFAULT_COMPRESSION,
    DEFAULT_FORMAT,
    FORMAT_NAMES,
    MIN_PART_BYTES,
)
from shared.export.phases import described
from shared.export.request import SCHEDULE_REFUSED_OPTIONS, SHOWN_FIELDS, ExportRequest
from shared.ids import ID_PATTERN
from shared.rate_policies import PolicyName
from shared.states import TERMINAL, PauseReason, ScheduleMode, ScheduleState, State, WaitingReason
from shared.timefmt import ceil_millisecond, parse_instant, parse_timestamp

# The largest seq Postgres' bigint holds; a bigger after_seq would fail in the driver, not validate.
MAX_SEQ = 2**63 - 1
MAX_PAGE_LIMIT = 1000
MAX_OPERATIONS_PAGE = 100
MAX_WAIT_SECONDS = 60
MAX_CONVERSATIONS_PAGE = 100
# The longest search text of the conversations' list, in characters: an id is at most 64.
MAX_CONVERSATION_SEARCH = 100
MAX_MEMBERS = 10_000
MAX_SENDERS = 100


def _clean_text(value: str) -> str:
    # Postgres text cannot hold U+0000, and json.loads lets lone surrogates through.
    if "\x00" in value:
        raise ValueError("must not contain U+0000")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must not contain lone surrogates") from None
    return value


CleanText = Annotated[StrictStr, AfterValidator(_clean_text)]
Identifier = Annotated[StrictStr, Field(pattern=f"^{ID_PATTERN}$")]
MessageId = Annotated[CleanText, Field(min_length=1, max_length=64)]
AttachmentId = Annotated[CleanText, Field(min_length=1, max_length=64)]
# The most attachments one message carries, and the longest file name an upload gives (characters).
MAX_MESSAGE_ATTACHMENTS = 20
MAX_FILE_NAME = 255


# A media type an export with media includes: ``type/subtype``, or ``type/*`` for every subtype (RFC 9110 section
# 8.3.1's tokens), compared without regard to case.
MediaTypePattern = Annotated[
    StrictStr, Field(pattern=r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+/(\*|[!#$%&'*+.^_`|~0-9A-Za-z-]+)$", max_length=255)
]
MAX_MEDIA_TYPES = 20


def _distinct(values: list[str]) -> list[str]:
    if len(set(values)) != len(values):
        raise ValueError("must not name an item twice")
    return values


# The byte limit depends on the route and the settings; the views check it (docs/api.md: Message store).
# The length bound comes before the text check so that its message speaks of characters, not "items".
MessageBody = Annotated[StrictStr, Field(min_length=1), AfterValidator(_clean_text)]


def _rfc3339(parse: Callable[[str], datetime]) -> Callable[[object], datetime]:
    """A validator of RFC 3339 text with ``parse`` (``shared.timefmt``)."""

    def validate(value: object) -> datetime:
        if not isinstance(value, str):
            raise ValueError("must be an RFC 3339 timestamp string")
        try:
            return parse(value)
        except ValueError:
            raise ValueError(
                "must be an RFC 3339 timestamp with a zone and a year from 1000 to 9999, e.g. 2026-11-30T08:00:00.000Z"
            ) from None

    return validate


def _digits(value: object) -> object:
    # Query values are text; only plain ASCII digits are an integer here ("+1", "1.0" and "1_000" are not,
    # although pydantic's lax mode would take them).
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    raise ValueError("must be a non-negative integer written in decimal digits")


Timestamp = Annotated[datetime, BeforeValidator(_rfc3339(parse_timestamp))]
# The window's bounds keep their precision until the request is made canonical (``export_request``).
Instant = Annotated[datetime, BeforeValidator(_rfc3339(parse_instant))]
# Placed after the bounds in each ``Annotated``: before them, pydantic still checks the bounds but leaves
# them out of the JSON schema's minimum/maximum.
QUERY_DIGITS = BeforeValidator(_digits)


def _no_default(schema: JsonDict) -> None:
    # A member that is absent rather than null: its schema shows neither null nor a default of null.
    schema.pop("default", None)


# For ``X | SkipJsonSchema[None] = ABSENT``: optional, never null on the wire.
ABSENT: Any = Field(default=None, json_schema_extra=_no_default)


def _not_null(schema: JsonDict) -> None:
    # ``X | None`` validates like an optional X (one error, at the field's own loc), but its schema would
    # offer null: keep only X's.
    variants = schema.pop("anyOf", [])
    assert isinstance(variants, list)
    schema.update(next(variant for variant in variants if isinstance(variant, dict) and variant.get("type") != "null"))
    _no_default(schema)


# For a query parameter or body member ``X | None = ABSENT_PARAMETER``: optional, and a bad value is one
# error at its name.
ABSENT_PARAMETER: Any = Field(default=None, json_schema_extra=_not_null)


class StrictModel(BaseModel):
    """Unknown fields are a validation error (docs/api.md: Error codes: VALIDATION_FAILED)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class NotifyTarget(StrictModel):
    """Where to send the completion callback (docs/api.md: Completion callbacks)."""

    url: Annotated[StrictStr, Field(min_length=1, max_length=900)]


SenderList = Annotated[list[Identifier], Field(min_length=1, max_length=MAX_SENDERS)]
if TYPE_CHECKING:
    FormatName = str
    Compression = str
else:
    # The registry's names (shared.export.formats) as literals, which the JSON schema shows as an enum.
    FormatName = Literal[FORMAT_NAMES]
    Compression = Literal[COMPRESSIONS]


class ExportOptions(StrictModel):
    """The export options a submit and a schedule take alike, with their callback (docs/api.md: Submitting an export,
    Export options; docs/api.md: Export schedules).
    """

    format: FormatName = DEFAULT_FORMAT
    notify: NotifyTarget | SkipJsonSchema[None] = ABSENT
    # Bounded by Postgres' bigint: a bigger value is a 422 here, not a driver error (a 500) at insert.
    after_seq: Annotated[StrictInt, Field(ge=0, le=MAX_SEQ)] = 0
    # null is taken as absent, like before_seq's.
    since: Instant | None = ABSENT_PARAMETER
    senders: SenderList | None = ABSENT_PARAMETER
    compression: Compression = DEFAULT_COMPRESSION
    max_part_bytes: Annotated[StrictInt, Field(ge=MIN_PART_BYTES, le=MAX_SEQ)] | None = ABSENT_PARAMETER

    def export_request(self, *, notify_url: str | None) -> ExportRequest:
        """The canonical request (``shared.export.request``): the fields of the same names (a request field
        the body has not takes its default), the checked callback URL, the senders as a set and the media types
        in lower case, sorted, as a set.
        """
        given: dict[str, Any] = {name: getattr(self, name) for name in SHOWN_FIELDS if hasattr(self, name)}
        media_types = getattr(self, "media_types", None)
        canonical: dict[str, Any] = {
            **given,
            # sent_at is kept to the millisecond: the next whole millisecond selects the same messages.
            **{bound: ceil_millisecond(given[bound]) for bound in ("since", "until") if given.get(bound) is not None},
            "senders": None if self.senders is None else tuple(sorted(set(self.senders))),
            "media_types": None if media_types is None else tuple(sorted({kind.lower() for kind in media_types})),
        }
        return ExportRequest(
            **canonical,
            notify_url=notify_url,
        )


class ExportSubmission(ExportOptions):
    """Body of ``POST /v3/conversations/{cid}/exports`` (docs/api.md: Submitting an export, Submit; Export options).
    The media options are the submit's alone: a schedule does not take them.
    """

    before_seq: Annotated[StrictInt, Field(ge=1, le=MAX_SEQ)] | None = None
    until: Instant | None = ABSENT_PARAMETER
    media: StrictBool = False
    media_types: Annotated[list[MediaTypePattern], Field(min_length=1, max_length=MAX_MEDIA_TYPES)] | None = (
        ABSENT_PARAMETER
    )
    media_max_file_bytes: Annotated[StrictInt, Field(ge=1, le=MAX_SEQ)] | None = ABSENT_PARAMETER
    media_max_total_bytes: Annotated[StrictInt, Field(ge=1, le=MAX_SEQ)] | None = ABSENT_PARAMETER

    @model_validator(mode="after")
    def _media_options_need_media(self) -> ExportSubmission:
        limits = (self.media_types, self.media_max_file_bytes, self.media_max_total_bytes)
        if not self.media and any(limit is not None for limit in limits):
            raise PydanticCustomError("media_options", "media_types and the media limits need media: true")
        if self.media and self.compression != DEFAULT_COMPRESSION:
            raise PydanticCustomError("media_compression", "a ZIP with media is not compressed again: leave out gzip")
        return self

    @model_validator(mode="after")
    def _range_not_empty_by_construction(self) -> ExportSubmission:
        # Checked after defaults, so {"before_seq": 1} and {"before_seq": 1, "after_seq": 0}, which are the
        # same canonical request (docs/api.md: Submitting an export, Submit), are judged alike: both describe an empty
        # range.
        if self.before_seq is not None and not self.after_seq < self.before_seq - 1:
            raise PydanticCustomError("seq_range", "after_seq must be less than before_seq - 1")
        return self

    @field_validator("until")
    @classmethod
    def _window_not_empty(cls, until: datetime | None, info: ValidationInfo) -> datetime | None:
        since = info.data.get("since")
        if until is not None and since is not None and until <= since:
            raise ValueError("must be later than since")
        return until


class ExportScheduleSubmission(ExportOptions):
    """Body of ``POST /v3/conversations/{cid}/export-schedules`` (docs/api.md: Export schedules): the interval,
    its anchor and the chain's mode, and the submit's options, validated as the submit validates them. The
    interval's syntax is ``shared.export.cadence``'s to check.
    """

    every: Annotated[
        StrictStr,
        Field(
            min_length=1,
            max_length=64,
            description="An ISO 8601 duration of whole units: `P1D`, `PT6H`, `P1W`, `P1M`, `P1Y2M10DT2H30M`.",
        ),
    ]
    start_at: Timestamp | None = ABSENT_PARAMETER
    mode: ScheduleMode = ScheduleMode.INCREMENTAL
    # ``SCHEDULE_REFUSED_OPTIONS``, read under the submit's names whatever their value only to be refused with
    # a code of their own (``refused_options``); null is absent, as in a submit. Attributes of other names keep
    # them out of ``export_request``.
    refused_before_seq: SkipJsonSchema[Any] = Field(None, alias="before_seq")
    refused_until: SkipJsonSchema[Any] = Field(None, alias="until")

    def refused_options(self) -> list[str]:
        """The names of the submit's options given that a schedule refuses (``SCHEDULE_REFUSED_OPTIONS``)."""
        return [name for name in SCHEDULE_REFUSED_OPTIONS if getattr(self, f"refused_{name}") is not None]


class EmptyRequest(StrictModel):
    """Body of ``POST /v3/operations/{id}/cancel`` (docs/states.md: States and failure model, Cancel) and ``POST
    /admin/operations/{id}/requeue``: empty or ``{}``.
    """


class MessageSubmission(StrictModel):
    """Body of ``POST /v2/conversations/{cid}/messages`` (docs/api.md: Message store; Replies and edits:
    ``reply_to``, the message_id of a message of the conversation, not recalled, that it replies to).
    """

    message_id: MessageId
    body: MessageBody
    reply_to: MessageId | SkipJsonSchema[None] = ABSENT
    attachments: (
        Annotated[
            list[AttachmentId],
            Field(min_length=1, max_length=MAX_MESSAGE_ATTACHMENTS),
            AfterValidator(_distinct),
        ]
        | SkipJsonSchema[None]
    ) = ABSENT


class AttachmentUploadQuery(StrictModel):
    """Query of ``POST /v2/conversations/{cid}/attachments`` (docs/api.md: Message store, Attachments): the file's
    name as the uploader gives it, any text of 1 to 255 characters but U+0000; an export makes it safe.
    """

    name: Annotated[CleanText, Field(min_length=1, max_length=MAX_FILE_NAME)]


class StoredAttachment(StrictModel):
    """An attachment as the store holds it: what its upload answers, and each of a message's ``attachments``
    (those carry ``message_shape.ATTACHMENT_FIELDS`` only)."""

    attachment_id: str
    file_name: str
    content_type: str
    size_bytes: Annotated[int, Field(ge=0)]
    sha256: str | SkipJsonSchema[None] = Field(
        default=None, description="Hex SHA-256 of the file; in the upload's answer only.", json_schema_extra=_no_default
    )


class MessageEdit(StrictModel):
    """Body of ``PATCH /v2/conversations/{cid}/messages/{message_id}`` (docs/api.md: Message store, Replies and
    edits): the new body.
    """

    body: MessageBody


class MessagePageQuery(StrictModel):
    """Query of ``GET /v2/conversations/{cid}/messages`` (docs/api.md: Message store: ``limit <=
    1000``)."""

    after_seq: Annotated[int, Field(ge=0, le=MAX_SEQ), QUERY_DIGITS] = 0
    limit: Annotated[int, Field(ge=1, le=MAX_PAGE_LIMIT), QUERY_DIGITS] = 100


class ConversationListQuery(StrictModel):
    """Query of ``GET /v2/conversations?q=&limit=&cursor=`` (docs/api.md: Message store)."""

    q: Annotated[CleanText, Field(min_length=1, max_length=MAX_CONVERSATION_SEARCH)] | SkipJsonSchema[None] = ABSENT
    limit: Annotated[int, Field(ge=1, le=MAX_CONVERSATIONS_PAGE), QUERY_DIGITS] = 50
    cursor: str | SkipJsonSchema[None] = ABSENT


# A keyset list's page size and cursor: the operations' and the schedules' lists page alike.
PageLimit = Annotated[int, Field(ge=1, le=MAX_OPERATIONS_PAGE), QUERY_DIGITS]
PageCursor = str | SkipJsonSchema[None]


class OperationListQuery(StrictModel):
    """Query of ``GET /v3/operations?state=&limit=&cursor=`` (docs/api.md: Operations, Operation)."""

    state: State | None = ABSENT_PARAMETER
    limit: PageLimit = 20
    cursor: PageCursor = ABSENT


class SchedulePageQuery(StrictModel):
    """Query of ``GET /v3/export-schedules`` and of a schedule's runs (docs/api.md: Export schedules):
    ``cursor`` is a ``next_cursor`` passed back as it is.
    """

    limit: PageLimit = 20
    cursor: PageCursor = ABSENT


class EmptyQuery(StrictModel):
    """A query string with no parameters: any parameter is unknown (422)."""


class OperationQuery(StrictModel):
    """Query of ``GET /v3/operations/{id}?wait=``: ``wait`` seconds (1-60) to wait for the state to change
    (docs/api.md: Operations, Waiting for a change).
    """

    wait: Annotated[int, Field(ge=1, le=MAX_WAIT_SECONDS), QUERY_DIGITS] | None = ABSENT_PARAMETER


class DownloadQuery(StrictModel):
    """Query of a download (the result, or a part): ``delivery=redirect`` asks for a ``303`` to a presigned
    storage URL instead of the file, ``stream`` (the default) for the file itself (docs/api.md: Downloads,
    Download by redirect).
    """

    delivery: Literal["stream", "redirect"] | None = ABSENT_PARAMETER


class AdminOperationListQuery(OperationListQuery):
    """Query of ``GET /admin/operations``: the user list's parameters, with the owner and the conversation
    as filters besides the state (docs/api.md: Administration, Admin list of operations).
    """

    conversation_id: Identifier | None = ABSENT_PARAMETER
    owner_id: Identifier | None = ABSENT_PARAMETER


class MemberSet(StrictModel):
    """Body of ``PUT /admin/conversations/{cid}``: the complete member set (docs/api.md: Message
    store)."""

    members: Annotated[list[Identifier], Field(max_length=MAX_MEMBERS)]


class ImportedMessage(StrictModel):
    """One NDJSON line of ``POST /admin/conversations/{cid}/messages:import`` (docs/api.md: Message
    store).

    ``sent_at`` absent or null: the time of the import.
    """

    message_id: MessageId
    sender_id: Identifier
    body: MessageBody
    sent_at: Timestamp | None = None


# Response models (docs/api.md: Error codes; docs/api.md: Message store; docs/api.md: Operations,
# Operation). Field order is the order the views write.

TimestampText = Annotated[
    str,
    Field(
        pattern=r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z$",
        json_schema_extra={"format": "date-time"},
        description="RFC 3339 in UTC with millisecond precision and a Z suffix"
        " (docs/api.md: Submitting an export, The file).",
    ),
]
Seq = Annotated[int, Field(ge=1, le=MAX_SEQ)]
# A seq or 0: where a range starts, exclusive.
SeqFrom = Annotated[int, Field(ge=0, le=MAX_SEQ)]
PartBytes = Annotated[int, Field(ge=MIN_PART_BYTES)]
Count = Annotated[int, Field(ge=0)]
Sha256 = Annotated[str, Field(pattern="^[0-9a-f]{64}$")]


class FieldError(StrictModel):
    """One validation error: where (``["body", "format"]``, ``["query", "limit"]``) and what is wrong."""

    loc: list[str | int]
    msg: str


class Problem(StrictModel):
    """An RFC 9457 problem (``application/problem+json``) with a stable ``code`` (docs/api.md: Error codes).

    ``errors`` comes with VALIDATION_FAILED only (at most ``problems.MAX_LISTED_ERRORS`` of them, and
    ``error_count`` of them in all); ``state`` with refusals that depend on an operation's state;
    ``violated-policies`` with a 429 of a rate limit or a per-user bound (docs/api.md: Rate limits).
    """

    type: Annotated[str, Field(json_schema_extra={"format": "uri"})]
    title: str
    status: Annotated[int, Field(ge=400, le=599)]
    detail: str
    code: Annotated[str, Field(pattern="^[A-Z][A-Z_]*$")]
    errors: list[FieldError] | SkipJsonSchema[None] = ABSENT
    error_count: Annotated[int, Field(ge=1)] | SkipJsonSchema[None] = ABSENT
    state: State | SkipJsonSchema[None] = ABSENT
    violated_policies: Annotated[list[PolicyName], Field(min_length=1)] | SkipJsonSchema[None] = Field(
        default=None, alias="violated-policies", json_schema_extra=_no_default
    )


class Message(StrictModel):
    """A stored message as the read API shows it, identical to a line of the export file (docs/api.md: Submitting an
    export, The file)."""

    conversation_id: str
    seq: Seq
    message_id: str
    sender_id: str
    sent_at: TimestampText
    body: str
    reply_to: str | SkipJsonSchema[None] = Field(
        default=None,
        description="The message_id of the message it replies to; left out when it replies to none.",
        json_schema_extra=_no_default,
    )
    edited_at: TimestampText | SkipJsonSchema[None] = Field(
        default=None,
        description="When the body was last edited (as of the export's snapshot in a file); left out when never.",
        json_schema_extra=_no_default,
    )
    attachments: list[StoredAttachment] | SkipJsonSchema[None] = Field(
        default=None,
        description="The files it carries, in the order it was sent with them; left out when none.",
        json_schema_extra=_no_default,
    )


class MessagePage(StrictModel):
    """``GET /v2/conversations/{cid}/messages``: ``next_after_seq`` is null on the last page."""

    messages: list[Message]
    next_after_seq: Seq | None


class Conversation(StrictModel):
    """A conversation the caller is a member of: its last seq and the time of its newest message (null
    when it has none).
    """

    conversation_id: str
    last_seq: Seq
    last_message_at: TimestampText | None


class ConversationPage(StrictModel):
    """``GET /v2/conversations``: ordered by id; ``next_cursor`` is opaque and null on the last page."""

    conversations: list[Conversation]
    next_cursor: str | None


class StoredMessage(StrictModel):
    """``POST /v2/conversations/{cid}/messages``: the seq and time the store assigned."""

    status: Literal["stored"]
    conversation_id: str
    message_id: str
    seq: Seq
    sent_at: TimestampText


class EditedMessage(StrictModel):
    """``PATCH /v2/conversations/{cid}/messages/{message_id}``: the message's seq and its last edit's time, null
    when the body sent was its unedited body.
    """

    status: Literal["edited"]
    conversation_id: str
    message_id: str
    seq: Seq
    edited_at: TimestampText | None


class RecalledMessage(StrictModel):
    """``DELETE /v2/conversations/{cid}/messages/{message_id}``."""

    status: Literal["recalled"]


class OperationRequest(StrictModel):
    """The export request after defaults: the canonical request without user, conversation and callback (docs/api.md:
    Submitting an export, Submit; Export options)."""

    format: FormatName
    before_seq: Seq | None
    after_seq: SeqFrom
    since: TimestampText | None
    until: TimestampText | None
    senders: list[str] | None
    compression: Compression
    max_part_bytes: PartBytes | None
    media: bool
    media_types: list[str] | None
    media_max_file_bytes: Annotated[int, Field(ge=1)] | None
    media_max_total_bytes: Annotated[int, Field(ge=1)] | None


class Estimate(StrictModel):
    """An upper bound of the messages the file will hold, and about the bytes it will store (an export with
    media: its messages and the files it includes), each null until it is known (docs/api.md: Operations,
    Operation)."""

    messages_at_most: Count | None
    bytes: Count | None


class Progress(StrictModel):
    """What a worker measured: a phase name and counts, never a percentage or an ETA (docs/api.md: Operations,
    Operation).
    """

    phase: Annotated[str, Field(description=described())]
    messages_written: Count
    bytes_written: Count


class Snapshot(StrictModel):
    """The watermark fixed when the export first started running, reused by every retry."""

    max_seq: Count


class OperationError(StrictModel):
    """Why an operation is RETRY_AT, FAILED or FAILED_REPAIR, in words a user can act on."""

    code: str
    message: str


class ResultPart(StrictModel):
    """One part of a split result: a complete file of its format holding the messages ``first_seq`` to
    ``last_seq`` (both null in the one part of an export without messages)."""

    number: Annotated[int, Field(ge=1)]
    url: str
    size_bytes: Count
    sha256: Sha256
    message_count: Count
    first_seq: Seq | None
    last_seq: Seq | None


class OperationResult(StrictModel):
    """The file of a SUCCEEDED export: one file (``url``, ``size_bytes``, ``sha256``) or, when the request gave
    ``max_part_bytes``, its ``parts``; ``next_after_seq`` is the ``after_seq`` of the next export of what is new."""

    url: str | SkipJsonSchema[None] = ABSENT
    expires_at: TimestampText
    size_bytes: Count | SkipJsonSchema[None] = ABSENT
    sha256: Sha256 | SkipJsonSchema[None] = ABSENT
    message_count: Count
    content_type: Literal[CONTENT_TYPES]  # type: ignore[valid-type]
    next_after_seq: SeqFrom
    parts: list[ResultPart] | SkipJsonSchema[None] = ABSENT


class OperationLinks(StrictModel):
    """``cancel`` while the operation is not terminal, ``result`` once it SUCCEEDED with one file (a split
    result's parts are in ``result.parts``)."""

    self_: str = Field(alias="self")
    cancel: str | SkipJsonSchema[None] = ABSENT
    result: str | SkipJsonSchema[None] = ABSENT


class Operation(StrictModel):
    """The status monitor of one export (docs/api.md: Operations, Operation); ``next_poll_after_seconds`` only while
    not terminal."""

    operation_id: str
    kind: Literal["conversation_export"]
    state: State
    conversation_id: str
    request: OperationRequest
    estimate: Estimate
    created_at: TimestampText
    updated_at: TimestampText
    attempt: Count
    progress: Progress
    snapshot: Snapshot | None
    retry_at: TimestampText | None
    error: OperationError | None
    result: OperationResult | None
    links: OperationLinks
    done: Annotated[
        bool,
        Field(
            description=f"True exactly in the terminal states ({', '.join(s for s in State if s in TERMINAL)}); "
            "an admin requeue of FAILED_REPAIR makes it false again."
        ),
    ]
    schedule_id: Annotated[str | None, Field(description="The schedule of a scheduled run; null otherwise.")]
    due_at: Annotated[
        TimestampText | None,
        Field(description="The due time a scheduled run was created for; null for an export submitted by hand."),
    ]
    next_poll_after_seconds: Annotated[int, Field(ge=1, le=30)] | SkipJsonSchema[None] = ABSENT


class WebhookSecret(StrictModel):
    """``GET /v3/webhooks/secret``: the caller's signing secret, and the previous one during a rotation."""

    secret: Annotated[str, Field(pattern="^whsec_[A-Za-z0-9+/=]+$")]
    previous_secret: Annotated[str, Field(pattern="^whsec_[A-Za-z0-9+/=]+$")] | None


class PolicyStanding(StrictModel):
    """One policy and where the caller stands against it (docs/api.md: Rate limits)."""

    policy: PolicyName
    quota: Annotated[int, Field(ge=1)]
    window_seconds: Annotated[int, Field(ge=1)] | None = Field(
        description="The window the quota renews over; null for a budget or a bound on what is held at once."
    )
    unit: Literal["requests", "content-bytes", "concurrent-requests"]
    remaining: Annotated[int, Field(ge=0)]
    reset_seconds: Annotated[int, Field(ge=0)] | None = Field(
        description="Seconds until the window renews; for `content-bytes`, until a result expires; else null."
    )


class Limits(StrictModel):
    """``GET /v3/limits``: every policy the caller is held to, and whether none counts them (an admin token)."""

    exempt: bool
    policies: list[PolicyStanding]


class OperationPage(StrictModel):
    """``GET /v3/operations``: newest first; ``next_cursor`` is opaque and null on the last page."""

    operations: list[Operation]
    next_cursor: str | None


class ScheduleOptions(StrictModel):
    """The export options of every run of a schedule (docs/api.md: Export schedules): the operation's ``request``
    without ``before_seq`` and ``until``; ``after_seq`` is where the chain began.
    """

    format: FormatName
    after_seq: SeqFrom
    since: TimestampText | None
    senders: list[str] | None
    compression: Compression
    max_part_bytes: PartBytes | None


class ScheduleRun(StrictModel):
    """The run a schedule created last: its operation, the due time it is for, and its state then read."""

    operation_id: str
    due_at: TimestampText
    state: State


class ScheduleLinks(StrictModel):
    """The schedule itself and the list of its runs."""

    self_: str = Field(alias="self")
    runs: str


class Schedule(StrictModel):
    """An export schedule (docs/api.md: Export schedules). ``next_run_at`` is null while PAUSED; ``watermark`` is
    the seq the chain has reached, where the next incremental run starts.
    """

    schedule_id: str
    conversation_id: str
    every: str
    start_at: TimestampText
    mode: ScheduleMode
    options: ScheduleOptions
    state: ScheduleState
    paused_reason: PauseReason | None
    waiting_reason: WaitingReason | None
    next_run_at: TimestampText | None
    watermark: SeqFrom
    last_run: ScheduleRun | None
    created_at: TimestampText
    updated_at: TimestampText
    links: ScheduleLinks


class SchedulePage(StrictModel):
    """``GET /v3/export-schedules``: newest first; ``next_cursor`` is opaque and null on the last page."""

    schedules: list[Schedule]
    next_cursor: str | None


class ScheduleRunPage(StrictModel):
    """A schedule's runs, newest due time first; ``next_cursor`` is opaque and null on the last page."""

    operations: list[Operation]
    next_cursor: str | None
