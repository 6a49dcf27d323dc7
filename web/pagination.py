"""Cursor pagination: ``?limit=&cursor=`` in, ``{items, next_cursor}`` out.

Lists are ordered newest first by a key (a timestamp and an id, or a sequence
number) and resumed with a keyset condition, so pages stay stable while rows
are added. The cursor is the last key, base64url-encoded JSON: opaque to
clients, and checked strictly when it comes back (a tampered cursor is a 422).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Annotated, Any, Generic, TypeVar

from fastapi import Query
from pydantic import BaseModel, Field
from sqlalchemy import ColumnElement, tuple_
from sqlmodel.sql.expression import SelectOfScalar

from web.problems import invalid
from web.query import DIGITS_ONLY

T = TypeVar("T")
Row = TypeVar("Row")

MAX_LIMIT = 200

LimitParam = Annotated[
    int, Query(ge=1, le=MAX_LIMIT, description="Items per page (1-200)."), DIGITS_ONLY
]
CURSOR_PATTERN = r"^[A-Za-z0-9_-]+$"
CursorParam = Annotated[
    str | None,
    Query(max_length=512, pattern=CURSOR_PATTERN,
          description="next_cursor of the previous page, as issued (opaque base64url); omit "
                      "for the first. A cursor this API did not issue is refused with 422."),
]


class Page(BaseModel, Generic[T]):
    """One page of a list and the cursor of the next page (null on the last)."""

    items: list[T]
    next_cursor: str | None = Field(default=None, description="Pass as ?cursor= for more")


def encode_cursor(key: Sequence[Any]) -> str:
    """The opaque cursor for a sort key."""
    plain = [value.isoformat() if isinstance(value, datetime) else value for value in key]
    return base64.urlsafe_b64encode(json.dumps(plain).encode()).decode().rstrip("=")


def decode_cursor(cursor: str, kinds: Sequence[type]) -> list[Any]:
    """The sort key in a cursor, each part converted to ``kinds``; 422 when it is not ours."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        parts = json.loads(raw)
        if not isinstance(parts, list) or len(parts) != len(kinds):
            raise ValueError("wrong shape")
        return [_convert(part, kind) for part, kind in zip(parts, kinds, strict=True)]
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError) as exc:
        raise invalid(
            "cursor is not one this API issued; pass next_cursor from the previous page"
        ) from exc


def _convert(value: Any, kind: type) -> Any:
    if kind is datetime:
        if not isinstance(value, str):
            raise TypeError("timestamp expected")
        return datetime.fromisoformat(value)
    if kind is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError("integer expected")
        return value
    if not isinstance(value, str):
        raise TypeError("string expected")
    return value


def keyset(
    statement: SelectOfScalar[Row],
    columns: Sequence[Any],
    cursor: str | None,
    kinds: Sequence[type],
    limit: int,
) -> SelectOfScalar[Row]:
    """Order newest first by ``columns`` and start after the cursor's key."""
    if cursor is not None:
        key = decode_cursor(cursor, kinds)
        condition: ColumnElement[bool] = (
            columns[0] < key[0] if len(columns) == 1 else tuple_(*columns) < tuple_(*key)
        )
        statement = statement.where(condition)
    return statement.order_by(*(column.desc() for column in columns)).limit(limit + 1)


def page_of(
    rows: Sequence[Row], limit: int, key: Callable[[Row], Sequence[Any]],
    convert: Callable[[Row], T],
) -> Page[T]:
    """A page from ``limit + 1`` fetched rows: the extra row only says there is more."""
    more = len(rows) > limit
    shown = list(rows[:limit])
    next_cursor = encode_cursor(key(shown[-1])) if more and shown else None
    return Page[T](items=[convert(row) for row in shown], next_cursor=next_cursor)
