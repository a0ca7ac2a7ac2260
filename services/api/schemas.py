"""Request models of the public API, strict so that ``"9"``, ``1e3`` and ``true`` are not integers."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, StrictStr, model_validator

from shared.ids import ID_PATTERN


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


class StrictModel(BaseModel):
    """Unknown fields are a validation error (contract 3: VALIDATION_FAILED)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ExportSubmission(StrictModel):
    """Body of ``POST /v3/conversations/{cid}/exports`` (contract 5.1)."""

    format: Literal["jsonl"]
    before_seq: Annotated[StrictInt, Field(ge=1)] | None = None
    after_seq: Annotated[StrictInt, Field(ge=0)] = 0

    @model_validator(mode="after")
    def _range_not_empty_by_construction(self) -> ExportSubmission:
        if self.before_seq is not None and not self.after_seq < self.before_seq - 1:
            raise ValueError("after_seq must be less than before_seq - 1")
        return self


class CancelRequest(StrictModel):
    """Body of ``POST /v3/operations/{id}/cancel``: empty or ``{}`` (contract 5.4)."""
