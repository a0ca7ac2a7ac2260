"""Request models of the public API, strict so that ``"9"``, ``1e3`` and ``true`` are not integers."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    model_validator,
)
from pydantic_core import PydanticCustomError

from shared.ids import ID_PATTERN
from shared.states import State
from shared.timefmt import parse_timestamp

# The largest seq Postgres' bigint holds; a bigger after_seq would fail in the driver, not validate.
MAX_SEQ = 2**63 - 1
MAX_PAGE_LIMIT = 1000
MAX_OPERATIONS_PAGE = 100
MAX_MEMBERS = 10_000


def _clean_text(value: str) -> str:
    # Postgres text cannot hold U+0000, and json.loads lets lone surrogates through (PITFALLS).
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
# The byte limit depends on the route and the settings; the views check it (contract 4). The length
# bound comes before the text check so that its message speaks of characters, not "items".
MessageBody = Annotated[StrictStr, Field(min_length=1), AfterValidator(_clean_text)]


def _rfc3339(value: object) -> datetime:
    if not isinstance(value, str):
        raise ValueError("must be an RFC 3339 timestamp string")
    try:
        return parse_timestamp(value)
    except ValueError:
        raise ValueError(
            "must be an RFC 3339 timestamp with a zone and a year from 1000 to 9999, e.g. 2026-11-30T08:00:00.000Z"
        ) from None


def _digits(value: object) -> object:
    # Query values are text; only plain ASCII digits are an integer here ("+1", "1.0" and "1_000" are not,
    # although pydantic's lax mode would take them).
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    raise ValueError("must be a non-negative integer written in decimal digits")


Timestamp = Annotated[datetime, BeforeValidator(_rfc3339)]
QueryInt = Annotated[int, BeforeValidator(_digits)]


class StrictModel(BaseModel):
    """Unknown fields are a validation error (contract 3: VALIDATION_FAILED)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ExportSubmission(StrictModel):
    """Body of ``POST /v3/conversations/{cid}/exports`` (contract 5.1)."""

    format: Literal["jsonl"]
    # Bounded by Postgres' bigint: a bigger value is a 422 here, not a driver error (a 500) at insert.
    before_seq: Annotated[StrictInt, Field(ge=1, le=MAX_SEQ)] | None = None
    after_seq: Annotated[StrictInt, Field(ge=0, le=MAX_SEQ)] = 0

    @model_validator(mode="after")
    def _range_not_empty_by_construction(self) -> ExportSubmission:
        # Checked after defaults, so {"before_seq": 1} and {"before_seq": 1, "after_seq": 0}, which are the
        # same canonical request (5.1), are judged alike: both describe an empty range.
        if self.before_seq is not None and not self.after_seq < self.before_seq - 1:
            raise PydanticCustomError("seq_range", "after_seq must be less than before_seq - 1")
        return self


class EmptyRequest(StrictModel):
    """Body of ``POST /v3/operations/{id}/cancel`` (contract 5.4) and ``POST /admin/operations/{id}/requeue``:
    empty or ``{}``.
    """


class MessageSubmission(StrictModel):
    """Body of ``POST /v2/conversations/{cid}/messages`` (contract 4)."""

    message_id: MessageId
    body: MessageBody


class MessagePageQuery(StrictModel):
    """Query of ``GET /v2/conversations/{cid}/messages`` (contract 4: ``limit <= 1000``)."""

    after_seq: Annotated[QueryInt, Field(ge=0, le=MAX_SEQ)] = 0
    limit: Annotated[QueryInt, Field(ge=1, le=MAX_PAGE_LIMIT)] = 100


class OperationListQuery(StrictModel):
    """Query of ``GET /v3/operations?state=&limit=&cursor=`` (contract 5.2)."""

    state: State | None = None
    limit: Annotated[QueryInt, Field(ge=1, le=MAX_OPERATIONS_PAGE)] = 20
    cursor: str | None = None


class MemberSet(StrictModel):
    """Body of ``PUT /admin/conversations/{cid}``: the complete member set (contract 4)."""

    members: Annotated[list[Identifier], Field(max_length=MAX_MEMBERS)]


class ImportedMessage(StrictModel):
    """One NDJSON line of ``POST /admin/conversations/{cid}/messages:import`` (contract 4).

    ``sent_at`` absent or null: the time of the import.
    """

    message_id: MessageId
    sender_id: Identifier
    body: MessageBody
    sent_at: Timestamp | None = None
