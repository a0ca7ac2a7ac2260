"""A stored message as the product shows it (docs/api.md: Message store; The file): the read API's
message object, a line of a JSONL export and a row of a CSV export hold the fields of ``FIELDS``, in that
order and with the same values; the HTML and TXT exports show some of them.

The read API's model (``services.api.http.schemas.Message``) and the JSONL line Postgres renders
(``shared.export.rendering.JSONL_LINE_SQL``) are built from or tested against ``FIELDS``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final, Protocol

from shared.timefmt import format_timestamp

FIELDS: Final = ("conversation_id", "seq", "message_id", "sender_id", "sent_at", "body")


class ExportedMessage(Protocol):
    """One message read for an export (``shared.repository.export_reader.ExportRow``): its ``FIELDS`` but
    the conversation's id, which its renderer is given once per file, and ``line``, its JSONL line as Postgres
    rendered it, without the newline.
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
    def line(self) -> str: ...


def message_json(values: Mapping[str, Any]) -> dict[str, Any]:
    """The message of ``values`` (a row or mapping with a value for each of ``FIELDS``, ``sent_at`` an aware
    datetime) as the read API shows it: ``FIELDS`` in order, ``sent_at`` as an API timestamp
    (``shared.timefmt``). Raises ``KeyError`` when a field is missing.
    """
    shown = {name: values[name] for name in FIELDS}
    shown["sent_at"] = format_timestamp(shown["sent_at"])
    return shown
