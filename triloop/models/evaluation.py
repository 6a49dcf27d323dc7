"""Frozen eval sets, their items, and versioned thresholds: governance owns all three."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Column, UniqueConstraint
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import Field, SQLModel

from triloop.models._columns import created_at_field, json_field, new_id, timestamp_field


class EvalSet(SQLModel, table=True):
    """A versioned set of tasks; once frozen it never changes (a new version does)."""

    __tablename__ = "eval_set"
    __table_args__ = (UniqueConstraint("name", "version"),)
    id: str = Field(default_factory=new_id, primary_key=True)
    name: str = Field(index=True)
    version: int
    content_hash: str | None = Field(default=None, description="sha256 over items once frozen")
    frozen_at: datetime | None = timestamp_field()
    created_by: str
    created_at: datetime = created_at_field()


class EvalItem(SQLModel, table=True):
    """One task in an eval set."""

    __tablename__ = "eval_item"
    eval_set_id: str = Field(foreign_key="eval_set.id", primary_key=True)
    ordinal: int = Field(primary_key=True)
    task_id: str = Field(foreign_key="task.id")


class Threshold(SQLModel, table=True):
    """A versioned gate threshold spec (e.g. min success rate, max regression)."""

    __tablename__ = "threshold"
    __table_args__ = (UniqueConstraint("name", "version"),)
    id: str = Field(default_factory=new_id, primary_key=True)
    name: str = Field(index=True)
    version: int
    # The default eval set: for a candidate trained on an environment ``eval_sets`` omits.
    eval_set_id: str | None = Field(default=None, foreign_key="eval_set.id")
    # Environment name (or environment version id) -> the frozen eval set ids a candidate
    # trained on it is judged on (migration 0029); NULL: every candidate on eval_set_id.
    eval_sets: dict[str, list[str]] | None = Field(
        default=None, sa_column=Column(JSONB(none_as_null=True), nullable=True))
    spec: dict[str, Any] = json_field()
    created_by: str
    created_at: datetime = created_at_field()
