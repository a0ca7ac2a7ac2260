"""The message store for members: send (a reply too), read, edit and recall (docs/api.md: Message store).

Checks run in the documented order (docs/api.md: Message store): the token (middleware), then the request
itself (415 / 413 / 400 / 422), then membership (404, identical for a missing conversation), then the store (409).
"""

from __future__ import annotations

import logging

import asyncpg
from aiohttp import web
from pydantic import TypeAdapter, ValidationError

from services.api.http.bodies import JSON_BODY_PROBLEMS, check_body_bytes, read_model, validate_query
from services.api.http.contract import Answer, Body, Endpoint
from services.api.http.keys import POOL, PRINCIPAL, SETTINGS
from services.api.http.pagination import decode_conversation_cursor, encode_conversation_cursor, page_endpoint
from services.api.http.problems import ProblemError, not_found
from services.api.http.responses import NO_STORE, json_response
from services.api.http.schemas import (
    ConversationListQuery,
    ConversationPage,
    EditedMessage,
    EmptyQuery,
    MessageEdit,
    MessageId,
    MessagePage,
    MessagePageQuery,
    MessageSubmission,
    RecalledMessage,
    StoredMessage,
)
from shared.export.message_shape import message_json
from shared.ids import is_valid_id
from shared.repository import message_store
from shared.timefmt import format_timestamp

log = logging.getLogger(__name__)

_MESSAGE_ID = TypeAdapter(MessageId)


async def _require_member(conn: asyncpg.Connection, *, conversation_id: str, user_id: str) -> None:
    if not await message_store.is_member(conn, conversation_id=conversation_id, user_id=user_id):
        raise not_found()


async def send_message(request: web.Request) -> web.Response:
    """``POST /v2/conversations/{cid}/messages``: store one message and answer its seq and sent_at."""
    validate_query(EmptyQuery, request)
    settings = request.app[SETTINGS]
    message = await read_model(request, MessageSubmission, max_bytes=settings.message_request_max_bytes)
    check_body_bytes(message.body, max_bytes=settings.message_body_max_bytes, loc=["body", "body"])
    conversation_id = request.match_info["cid"]
    sender_id = request[PRINCIPAL].user_id
    async with request.app[POOL].acquire() as conn:
        await _require_member(conn, conversation_id=conversation_id, user_id=sender_id)
        try:
            stored = await message_store.store_message(
                conn,
                conversation_id=conversation_id,
                message_id=message.message_id,
                sender_id=sender_id,
                body=message.body,
                reply_to=message.reply_to,
                attachments=message.attachments or (),
            )
        except message_store.DuplicateMessageId:
            raise ProblemError(
                "DUPLICATE_MESSAGE_ID",
                "A message with this message_id is already stored in the conversation.",
            ) from None
        except message_store.AttachmentNotFound as missing:
            assert message.attachments is not None  # only a send that names attachments misses one
            raise ProblemError(
                "ATTACHMENT_NOT_FOUND",
                "attachments names a file the sender has not uploaded to this conversation.",
                errors=[
                    {
                        "loc": ["body", "attachments", message.attachments.index(missing.args[0])],
                        "msg": "no such attachment of yours in this conversation",
                    }
                ],
            ) from None
        except message_store.ReplyTargetNotFound:
            raise ProblemError(
                "REPLY_TARGET_NOT_FOUND",
                "reply_to names no message of the conversation that is not recalled.",
                errors=[{"loc": ["body", "reply_to"], "msg": "no such message in this conversation"}],
            ) from None
    return json_response(
        {
            "status": "stored",
            "conversation_id": conversation_id,
            "message_id": message.message_id,
            "seq": stored.seq,
            "sent_at": format_timestamp(stored.sent_at),
        }
    )


async def list_conversations(request: web.Request) -> web.Response:
    """``GET /v2/conversations?q=&limit=&cursor=``: the conversations the caller is a member of, by id, with
    their last seq and the time of their newest message; with ``q``, those whose id holds it (docs/api.md:
    Message store).
    """
    query = validate_query(ConversationListQuery, request)
    after = decode_conversation_cursor(query.cursor)
    async with request.app[POOL].acquire() as conn:
        rows = await message_store.list_conversations(
            conn, user_id=request[PRINCIPAL].user_id, after=after, limit=query.limit + 1, search=query.q
        )
    shown = rows[: query.limit]
    more = len(rows) > query.limit
    return json_response(
        {
            "conversations": [
                {
                    "conversation_id": row.conversation_id,
                    "last_seq": row.last_seq,
                    "last_message_at": format_timestamp(row.last_message_at),
                }
                for row in shown
            ],
            "next_cursor": encode_conversation_cursor(shown[-1].conversation_id) if more else None,
        },
        headers=NO_STORE,
    )


async def read_messages(request: web.Request) -> web.Response:
    """``GET /v2/conversations/{cid}/messages?after_seq=&limit=``: one page of non-recalled messages.

    ``next_after_seq`` is the last seq of the page when more messages followed it at read time, else null.
    """
    page = validate_query(MessagePageQuery, request)
    conversation_id = request.match_info["cid"]
    async with request.app[POOL].acquire() as conn:
        await _require_member(conn, conversation_id=conversation_id, user_id=request[PRINCIPAL].user_id)
        # One row more than asked tells whether another page exists without a second query.
        rows = await message_store.read_messages(
            conn, conversation_id=conversation_id, after_seq=page.after_seq, limit=page.limit + 1
        )
    shown = rows[: page.limit]
    more = len(rows) > page.limit
    return json_response(
        {
            "messages": [message_json(row) for row in shown],
            "next_after_seq": shown[-1]["seq"] if more else None,
        }
    )


async def edit_message(request: web.Request) -> web.Response:
    """``PATCH /v2/conversations/{cid}/messages/{message_id}``: the sender, still a member, replaces the body of a
    message not recalled; anyone else, a missing or recalled message: 404 (docs/api.md: Message store, Replies
    and edits). The same body again changes nothing and answers as the first time did.
    """
    validate_query(EmptyQuery, request)
    settings = request.app[SETTINGS]
    edit = await read_model(request, MessageEdit, max_bytes=settings.message_request_max_bytes)
    check_body_bytes(edit.body, max_bytes=settings.message_body_max_bytes, loc=["body", "body"])
    conversation_id = request.match_info["cid"]
    message_id = request.match_info["message_id"]
    sender_id = request[PRINCIPAL].user_id
    if not _is_message_id(message_id):
        raise not_found()
    async with request.app[POOL].acquire() as conn:
        await _require_member(conn, conversation_id=conversation_id, user_id=sender_id)
        edited = await message_store.edit_message(
            conn, conversation_id=conversation_id, message_id=message_id, sender_id=sender_id, body=edit.body
        )
    if edited.outcome is message_store.EditOutcome.NOT_FOUND:
        raise not_found()
    if edited.outcome is message_store.EditOutcome.EDITED:
        log.info("message edited", extra={"conversation_id": conversation_id, "sender_id": sender_id})
    return json_response(
        {
            "status": "edited",
            "conversation_id": conversation_id,
            "message_id": message_id,
            "seq": edited.seq,
            "edited_at": format_timestamp(edited.edited_at),
        }
    )


async def recall_message(request: web.Request) -> web.Response:
    """``DELETE /v2/conversations/{cid}/messages/{message_id}``: the sender recalls; anyone else 404.

    Only the sender counts, whether or not still a member (docs/api.md: Message store, Recall: it
    names no other condition). Recalling an already recalled message answers 200 again (idempotent DELETE).
    """
    validate_query(EmptyQuery, request)
    conversation_id = request.match_info["cid"]
    message_id = request.match_info["message_id"]
    sender_id = request[PRINCIPAL].user_id
    # Path segments that break the id rules cannot be stored (U+0000 would even fail in Postgres).
    if not (is_valid_id(conversation_id) and _is_message_id(message_id)):
        raise not_found()
    async with request.app[POOL].acquire() as conn:
        recalled = await message_store.recall_message(
            conn, conversation_id=conversation_id, message_id=message_id, sender_id=sender_id
        )
    if not recalled:
        raise not_found()
    log.info("message recalled", extra={"conversation_id": conversation_id, "sender_id": sender_id})
    return json_response({"status": "recalled"})


def _is_message_id(value: str) -> bool:
    try:
        _MESSAGE_ID.validate_python(value)
    except ValidationError:
        return False
    return True


ENDPOINTS = (
    page_endpoint(
        "listConversations",
        list_conversations,
        "The conversations the caller is a member of, by id",
        tag="messages",
        query=ConversationListQuery,
        page=ConversationPage,
    ),
    Endpoint(
        route="sendMessage",
        handler=send_message,
        summary="Store a message in a conversation the caller is a member of",
        tag="messages",
        description="`body` is at most `CHATEXPORT_MESSAGE_BODY_MAX_BYTES` UTF-8 bytes (default 6) and the request "
        "at most `CHATEXPORT_MESSAGE_REQUEST_MAX_BYTES` (default 4096). A `message_id` already stored in the "
        "conversation is a 409, also after a recall.",
        body=Body(MessageSubmission, "The message."),
        answers=(Answer(200, "Stored, with the seq and time it was given.", StoredMessage),),
        problems=(
            *JSON_BODY_PROBLEMS,
            "NOT_FOUND",
            "REPLY_TARGET_NOT_FOUND",
            "ATTACHMENT_NOT_FOUND",
            "DUPLICATE_MESSAGE_ID",
        ),
    ),
    Endpoint(
        route="editMessage",
        handler=edit_message,
        summary="The sender replaces the body of a message",
        tag="messages",
        description="The sender, still a member, edits a message not recalled; the body has the send's limits. "
        "Reads show the new body with `edited_at`; an export shows each body as of its snapshot. The same body "
        "again changes nothing. Anyone but the sender, a missing or recalled message or conversation: the same "
        "404.",
        body=Body(MessageEdit, "The new body."),
        answers=(Answer(200, "Edited, with the time of the message's last edit.", EditedMessage),),
        problems=(*JSON_BODY_PROBLEMS, "NOT_FOUND"),
    ),
    Endpoint(
        route="readMessages",
        handler=read_messages,
        summary="Read non-recalled messages in seq order",
        tag="messages",
        description="Query values are plain decimal digits; other values and unknown parameters are a 422.",
        query=MessagePageQuery,
        answers=(Answer(200, "One page of messages.", MessagePage),),
        problems=("VALIDATION_FAILED", "NOT_FOUND"),
    ),
    Endpoint(
        route="recallMessage",
        handler=recall_message,
        summary="The sender recalls a message",
        tag="messages",
        description="Idempotent. Anyone but the sender, a missing message or conversation: the same 404.",
        answers=(Answer(200, "Recalled; it is never exported.", RecalledMessage),),
        problems=("VALIDATION_FAILED", "NOT_FOUND"),
    ),
)
