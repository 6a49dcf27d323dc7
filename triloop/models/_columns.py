"""Column helpers shared by the table modules (JSONB, arrays, timestamps, ids)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import BigInteger, Column, DateTime, Float, Integer, SmallInteger, Text, func
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlmodel import Field


def new_id() -> str:
    """A random opaque id (hex uuid4)."""
    return uuid.uuid4().hex


def utcnow() -> datetime:
    """Timezone-aware now in UTC."""
    return datetime.now(UTC)


def json_field(*, nullable: bool = False, default: Any = None) -> Any:
    """A JSONB column; a nullable one is NULL unless given (``task.item``: NULL means the
    seed alone makes the task, and ``{}`` would be an item)."""
    factory = (lambda: None) if nullable and default is None else (
        dict if default is None else (lambda: default))
    return Field(
        default_factory=factory,
        # none_as_null: None is SQL NULL, not the JSON value null, so ``item IS NULL`` holds
        # and 0026's unique index (coalesce(item::text, '')) sees one seed-only task per seed
        sa_column=Column(JSONB(none_as_null=True) if nullable else JSONB, nullable=nullable,
                         server_default="{}" if not nullable else None),
    )


def created_at_field() -> Any:
    """``created_at timestamptz default now()``."""
    return Field(
        default_factory=utcnow,
        sa_column=Column(DateTime(timezone=True), nullable=False, server_default=func.now()),
    )


def timestamp_field(*, nullable: bool = True) -> Any:
    """An optional timestamptz column."""
    return Field(default=None, sa_column=Column(DateTime(timezone=True), nullable=nullable))


def text_array_field() -> Any:
    """``text[]`` column, empty by default."""
    return Field(
        default_factory=list, sa_column=Column(ARRAY(Text), nullable=False, server_default="{}")
    )


def int_array_field() -> Any:
    """``integer[]`` column (token ids)."""
    return Field(
        default_factory=list, sa_column=Column(ARRAY(Integer), nullable=False, server_default="{}")
    )


def small_int_array_field() -> Any:
    """``smallint[]`` column (action masks)."""
    return Field(
        default_factory=list,
        sa_column=Column(ARRAY(SmallInteger), nullable=False, server_default="{}"),
    )


def float_array_field() -> Any:
    """``double precision[]`` column (logprobs)."""
    return Field(
        default_factory=list, sa_column=Column(ARRAY(Float), nullable=False, server_default="{}")
    )


def bigint_pk_field() -> Any:
    """``bigserial`` primary key."""
    return Field(default=None, sa_column=Column(BigInteger, primary_key=True, autoincrement=True))
