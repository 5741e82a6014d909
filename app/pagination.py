"""Cursor pagination over time-sortable ids: stable under inserts, no OFFSET scans."""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from sqlalchemy import Select
from sqlalchemy.orm import Session

from app.errors import BadRequest

DEFAULT_LIMIT = 50
MAX_LIMIT = 250


def parse_limit(raw: str | None) -> int:
    if raw is None or raw == "":
        return DEFAULT_LIMIT
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(
            "limit must be an integer", code="invalid_parameter", details={"parameter": "limit"}
        ) from None
    if not 1 <= value <= MAX_LIMIT:
        raise BadRequest(
            f"limit must be between 1 and {MAX_LIMIT}",
            code="invalid_parameter",
            details={"parameter": "limit"},
        )
    return value


def encode_cursor(last_id: str) -> str:
    return base64.urlsafe_b64encode(last_id.encode()).decode().rstrip("=")


# What a cursor carries: the last id of a page (a prefixed ULID, see app.ids).
_ID = re.compile(r"[a-z]{1,10}_[0-9A-HJKMNP-TV-Z]{26}")


def decode_cursor(cursor: str | None) -> str | None:
    """The id a cursor points after; anything that is not one of ours is a 400, not page 1."""
    if not cursor:
        return None
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        last_id = base64.urlsafe_b64decode(padded.encode()).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        last_id = ""
    if not _ID.fullmatch(last_id):
        raise BadRequest(
            "cursor is not valid", code="invalid_parameter", details={"parameter": "cursor"}
        )
    return last_id


def paginate(
    session: Session,
    stmt: Select[Any],
    id_column: Any,
    *,
    limit: int,
    cursor: str | None,
    newest_first: bool = True,
) -> tuple[list[Any], str | None]:
    """Run `stmt` one page at a time, keyed on `id_column`; returns rows and the next cursor."""
    after = decode_cursor(cursor)
    if after is not None:
        stmt = stmt.where(id_column < after if newest_first else id_column > after)
    stmt = stmt.order_by(id_column.desc() if newest_first else id_column.asc()).limit(limit + 1)
    rows = list(session.scalars(stmt))
    if len(rows) > limit:
        rows = rows[:limit]
        return rows, encode_cursor(getattr(rows[-1], id_column.key))
    return rows, None
