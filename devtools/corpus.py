"""Demo data: the ``chatterbot-corpus`` dialogs loaded into the message store (docs/api.md: Message
store).

Every corpus FILE ``chatterbot_corpus/data/<language>/<topic>.yml`` becomes one conversation
``corpus-<language>-<topic>`` whose members (``alice``, ``bob``, ``carol``) take turns as senders across the
file's dialog lines in file order: line k of the file (counting every stored line) is sent by
``MEMBERS[k % 3]``, so two consecutive messages never have the same sender.

Message ids are derived from the position in the file (``<topic>-<dialog#>-<line#>``, both 0-based) and
``sent_at`` from a fixed base time, so a second import stores nothing new: every line is skipped by the
message store's per-``message_id`` idempotency.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib import resources
from importlib.abc import Traversable
from typing import Any

import asyncpg
import yaml

from shared.ids import is_valid_id
from shared.repository.message_store import import_messages, put_members

log = logging.getLogger(__name__)

MEMBERS: tuple[str, ...] = ("alice", "bob", "carol")
CONVERSATION_PREFIX = "corpus-"
# Deterministic timestamps: a re-import produces byte-identical lines, and an export of a corpus
# conversation is the same file on every machine. One second apart keeps the order readable.
BASE_SENT_AT = datetime(2024, 1, 1, tzinfo=UTC)
# Conversations imported at once; each holds one pooled connection for one transaction.
DEFAULT_CONCURRENCY = 4

_INVALID_ID_CHARS = re.compile(r"[^A-Za-z0-9_.:-]")
# libyaml when the wheel has it (about 10x faster than the pure-Python parser). The *Base* loader keeps
# every scalar as the text written in the file: ``yes`` stays "yes" instead of becoming True, ``3.10``
# stays "3.10" instead of 3.1.
_Loader: Any = getattr(yaml, "CBaseLoader", yaml.BaseLoader)


@dataclass(frozen=True)
class CorpusLine:
    """One message to import; the field names are those of the admin import's NDJSON lines (docs/api.md: Administration,
    Import).
    """

    message_id: str
    sender_id: str
    body: str
    sent_at: datetime


@dataclass(frozen=True)
class CorpusConversation:
    """One corpus file as a conversation: its id, its member set and its lines in file order."""

    conversation_id: str
    language: str
    topic: str
    members: tuple[str, ...]
    lines: tuple[CorpusLine, ...]


@dataclass
class ImportSummary:
    """Counts of one import run: conversations touched, messages stored and messages already present."""

    conversations: int = 0
    imported: int = 0
    skipped: int = 0

    def add(self, imported: int, skipped: int) -> None:
        """Account for one conversation's import result."""
        self.conversations += 1
        self.imported += imported
        self.skipped += skipped


def data_dir() -> Traversable:
    """The package's ``data`` folder, holding one sub-folder per language."""
    return resources.files("chatterbot_corpus") / "data"


def available_languages() -> list[str]:
    """Every language folder of the installed corpus, sorted (e.g. ``["bengali", "chinese", ...]``)."""
    return sorted(entry.name for entry in data_dir().iterdir() if entry.is_dir() and not entry.name.startswith("_"))


def corpus_files(
    languages: Sequence[str] | None = None, *, limit_files: int | None = None
) -> list[tuple[str, Traversable]]:
    """``[(language, file), ...]`` for the ``.yml`` files of ``languages`` (all when None), sorted.

    ``limit_files`` caps the number of files PER LANGUAGE (None: no cap). Raises ``ValueError`` for a
    language the installed corpus does not have.
    """
    known = available_languages()
    chosen = known if languages is None else list(dict.fromkeys(languages))
    unknown = sorted(set(chosen) - set(known))
    if unknown:
        raise ValueError(f"unknown corpus language(s): {', '.join(unknown)}; known: {', '.join(known)}")
    files: list[tuple[str, Traversable]] = []
    for language in chosen:
        found = sorted(
            (entry for entry in (data_dir() / language).iterdir() if entry.name.endswith(".yml")),
            key=lambda entry: entry.name,
        )
        files.extend((language, entry) for entry in found[:limit_files])  # [:None] keeps all
    return files


def conversation_id_for(language: str, topic: str) -> str:
    """``corpus-<language>-<topic>``, with characters outside the id alphabet replaced and cut to 64."""
    candidate = _INVALID_ID_CHARS.sub("_", f"{CONVERSATION_PREFIX}{language}-{topic}")[:64]
    assert is_valid_id(candidate)
    return candidate


def load_file(language: str, path: Traversable) -> CorpusConversation:
    """Parse the corpus file ``path`` of ``language`` into a conversation.

    Raises ``ValueError`` when the file is not a YAML mapping (``yaml.YAMLError`` when not YAML at all).
    """
    topic = path.name.removesuffix(".yml")
    document = yaml.load(path.read_bytes(), Loader=_Loader)  # noqa: S506 - BaseLoader builds no objects
    if not isinstance(document, dict):
        raise ValueError(f"corpus file {path.name} is not a mapping")
    return build_conversation(language, topic, document.get("conversations") or [])


def build_conversation(language: str, topic: str, dialogs: Iterable[Any]) -> CorpusConversation:
    """Turn the ``conversations`` list of a corpus file into numbered, attributed lines.

    ``dialogs`` is ``[[line, line, ...], ...]``; a dialog written as a bare string counts as a one-line
    dialog. Lines that are numbers or booleans become their text; empty lines, nulls and nested
    containers are skipped but keep their position, so ids do not shift when a line is dropped.
    """
    lines: list[CorpusLine] = []
    for dialog_no, dialog in enumerate(dialogs):
        for line_no, raw in enumerate(dialog if isinstance(dialog, list) else [dialog]):
            body = _line_text(raw)
            if body is None:
                continue
            turn = len(lines)
            lines.append(
                CorpusLine(
                    message_id=_message_id(topic, dialog_no, line_no),
                    sender_id=MEMBERS[turn % len(MEMBERS)],
                    body=body,
                    sent_at=BASE_SENT_AT + timedelta(seconds=turn),
                )
            )
    return CorpusConversation(conversation_id_for(language, topic), language, topic, MEMBERS, tuple(lines))


def _line_text(raw: Any) -> str | None:
    if raw is None or isinstance(raw, dict | list):
        return None
    text = str(raw)
    # U+0000 cannot be stored in Postgres text; the corpus has none, but never fail on it.
    text = text.replace("\x00", "")
    return text if text.strip() else None


def _message_id(topic: str, dialog_no: int, line_no: int) -> str:
    suffix = f"-{dialog_no}-{line_no}"
    return _INVALID_ID_CHARS.sub("_", topic)[: 64 - len(suffix)] + suffix


async def import_conversation(conn: asyncpg.Connection, conversation: CorpusConversation) -> tuple[int, int]:
    """Store one conversation's members and lines in ONE transaction on ``conn``; return (imported, skipped).

    The member set is replaced by ``conversation.members``. Errors of the message store (for example a
    line it rejects) roll the whole conversation back and propagate.
    """
    async with conn.transaction():
        await put_members(conn, conversation_id=conversation.conversation_id, members=list(conversation.members))
        result = await import_messages(
            conn, conversation_id=conversation.conversation_id, lines=list(conversation.lines)
        )
    return result.imported, result.skipped


async def import_corpus(
    pool: asyncpg.Pool,
    *,
    languages: Sequence[str] | None = None,
    limit_files: int | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> ImportSummary:
    """Import the corpus files of ``languages`` (all when None, at most ``limit_files`` per language).

    Conversations are imported ``concurrency`` at a time, each in its own transaction: a conversation is
    stored completely or not at all. Raises ``ValueError`` for an unknown language, and re-raises (inside
    an ``ExceptionGroup``) what the message store raised for a rejected conversation; the imports still
    running then are cancelled and rolled back, the finished ones stay.
    """
    files = corpus_files(languages, limit_files=limit_files)
    summary = ImportSummary()
    gate = asyncio.Semaphore(concurrency)

    async def one(language: str, path: Traversable) -> None:
        conversation = load_file(language, path)
        async with gate, pool.acquire() as conn:
            imported, skipped = await import_conversation(conn, conversation)
        summary.add(imported, skipped)
        log.debug(
            "corpus conversation imported",
            extra={"conversation_id": conversation.conversation_id, "imported": imported, "skipped": skipped},
        )

    async with asyncio.TaskGroup() as group:
        for language, path in files:
            group.create_task(one(language, path))
    return summary
