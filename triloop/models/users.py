"""People who use the API and console, with hashed API tokens."""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Field, SQLModel

from triloop.models._columns import created_at_field, text_array_field, timestamp_field


class User(SQLModel, table=True):
    """A person with roles: ml_engineer, operator, auditor, admin."""

    __tablename__ = "app_user"
    name: str = Field(primary_key=True)
    roles: list[str] = text_array_field()
    token_hash: str = Field(unique=True, description="sha256 of the API token; never the token")
    disabled: bool = False
    created_by: str
    created_at: datetime = created_at_field()
    last_seen_at: datetime | None = timestamp_field()
