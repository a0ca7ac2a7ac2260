"""A stored message as the product shows it (docs/api.md: Message store; The file): the read API's
message object, a line of a JSONL export and a row of a CSV export hold the fields of ``FIELDS``, in that
order and with the same values, but that the JSON objects leave out an ``OPTIONAL_FIELDS`` field without a
value (a message that replies to none, one never edited), so that such a message shows exactly as it did
before those fields existed; the HTML and TXT exports show some of them.

The read API's model (``services.api.http.schemas.Message``) and the JSONL line Postgres renders
(``shared.export.rendering.JSONL_LINE_SQL``) are built from or tested against ``FIELDS``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final, Protocol

from shared.timefmt import format_timestamp

FIELDS: Final = (
    "conversation_id",
    "seq",
    "message_id",
    "sender_id",
    "sent_at",
    "body",
    "reply_to",
    "edited_at",
    "attachments",
)
# Left out of a JSON message when NULL (docs/api.md: Message store, Replies and edits; Attachments): ``reply_to``,
# the message_id of the message it replies to; ``edited_at``, when its body was last edited; ``attachments``, the
# files it carries, in the order it was sent with them.
OPTIONAL_FIELDS: Final = ("reply_to", "edited_at", "attachments")
# The members of each of a message's ``attachments``, in order.
ATTACHMENT_FIELDS: Final = ("attachment_id", "file_name", "content_type", "size_bytes")


class ExportedMessage(Protocol):
    """One message read for an export (``shared.repository.export_reader.ExportRow``): its ``FIELDS`` but
    the conversation's id, which its renderer is given once per file, and ``line``, its JSONL line as Postgres
    rendered it, without the newline. ``attachments`` is the JSON text of the field's value, as the line holds it.
    """

    @property
    def seq(self) -> int: ...

    @property
    def message_id(self) -> str: ...

    @property
    def sender_id(self) -> str: ...

    @property
    def sent_at(self) -> datetime: ...

    @property
    def body(self) -> str: ...

    @property
    def reply_to(self) -> str | None: ...

    @property
    def edited_at(self) -> datetime | None: ...

    @property
    def attachments(self) -> str | None: ...

    @property
    def line(self) -> str: ...


def message_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """Every one of ``FIELDS`` of ``values`` (a row or mapping with a value for each, ``sent_at`` an aware
    datetime, ``edited_at`` one or None, ``attachments`` JSON text or None), in order, times as API timestamps
    (``shared.timefmt``), ``attachments`` a list: a CSV row's cells, None for an empty one. Raises ``KeyError``
    when a field is missing.
    """
    shown = {name: values[name] for name in FIELDS}
    shown["sent_at"] = format_timestamp(shown["sent_at"])
    shown["edited_at"] = format_timestamp(shown["edited_at"])
    if shown["attachments"] is not None:
        shown["attachments"] = json.loads(shown["attachments"])
    return shown


def message_json(values: Mapping[str, Any]) -> dict[str, Any]:
    """The message of ``values`` (as ``message_values`` takes them) as the read API shows it: its
    ``message_values`` without the ``OPTIONAL_FIELDS`` that are None. Raises ``KeyError`` when a field is missing.
    """
    return {
        name: value
        for name, value in message_values(values).items()
        if value is not None or name not in OPTIONAL_FIELDS
    }
