"""Environments, their immutable versions (contracts), and admitted tasks."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Column, Text, UniqueConstraint
from sqlmodel import Field, SQLModel

from triloop.models._columns import created_at_field, json_field, new_id, timestamp_field


class Environment(SQLModel, table=True):
    """A named environment; its content lives in versions."""

    __tablename__ = "environment"
    name: str = Field(primary_key=True)
    description: str = ""
    created_by: str
    created_at: datetime = created_at_field()


class EnvironmentVersion(SQLModel, table=True):
    """An immutable environment contract; id = sha256 of its canonical form.

    The canonical form covers the contract, its fixtures' hashes and ``code_hashes``: the
    sha256 of each source file implementing the environment and its verifier.
    """

    __tablename__ = "environment_version"
    __table_args__ = (UniqueConstraint("environment_name", "version"),)
    id: str = Field(primary_key=True, description="sha256 of the canonical contract")
    environment_name: str = Field(foreign_key="environment.name", index=True)
    version: int = Field(description="1, 2, ... per environment, in registration order")
    contract: dict[str, Any] = json_field()
    contract_text: str = Field(sa_column=Column(Text, nullable=False))
    fixture_hashes: dict[str, Any] = json_field()
    code_hashes: dict[str, Any] = json_field()  # module (or file) -> sha256 of its source
    verifier_hash: str | None = Field(
        default=None, description="the verifier hash admission must observe (pinned here)"
    )
    created_by: str
    created_at: datetime = created_at_field()
    retired_at: datetime | None = timestamp_field()
    retired_by: str | None = None


class Task(SQLModel, table=True):
    """An environment version with a seed; usable for training only once admitted."""

    __tablename__ = "task"
    __table_args__ = (UniqueConstraint("environment_version_id", "seed"),)
    id: str = Field(default_factory=new_id, primary_key=True)
    environment_version_id: str = Field(foreign_key="environment_version.id", index=True)
    seed: int
    status: str = Field(default="pending", description="pending | admitted | rejected")
    evidence: dict[str, Any] = json_field()
    decided_by: str | None = None
    decided_at: datetime | None = timestamp_field()
    created_at: datetime = created_at_field()
