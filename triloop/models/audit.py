"""The append-only, hash-chained audit log."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Column, Text
from sqlmodel import Field, SQLModel

from triloop.models._columns import created_at_field, json_field


class AuditEvent(SQLModel, table=True):
    """One audited decision or change; ``hash = sha256(prev_hash || canonical row)``."""

    __tablename__ = "audit_event"
    # Assigned by the writer under the chain lock (not a sequence) so a rolled-back
    # insert never leaves a gap that verification would report.
    seq: int = Field(sa_column=Column(BigInteger, primary_key=True, autoincrement=False))
    at: datetime = created_at_field()
    actor: dict[str, Any] = json_field()
    action: str
    resource: dict[str, Any] = json_field()
    decision: str = Field(description="allow | deny | record")
    decision_id: str | None = None
    policy_revision: str | None = None
    payload: dict[str, Any] = json_field()
    prev_hash: str = Field(sa_column=Column(Text, nullable=False))
    hash: str = Field(sa_column=Column(Text, nullable=False, unique=True))
    db_role: str | None = Field(default=None, description="the database role that wrote it"
                                " (stated by the database; NULL before it was recorded)")
    hashed_in_db: bool = Field(default=False, description="PostgreSQL computed the hash from"
                               " the row as stored (migration 0020); older rows were hashed by"
                               " their writer")


class AccessEvent(SQLModel, table=True):
    """An allowed read: kept apart from the chain of decisions, append-only (0014)."""

    __tablename__ = "access_event"
    id: int | None = Field(default=None, sa_column=Column(BigInteger, primary_key=True))
    at: datetime = created_at_field()
    actor: dict[str, Any] = json_field()
    action: str
    resource: dict[str, Any] = json_field()
    decision_id: str | None = None
    policy_revision: str | None = None
    db_role: str | None = Field(default=None, description="stamped by the database")
