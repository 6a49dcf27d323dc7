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
    # Unique on (version, seed, md5 of item) and on (id, content_digest): migration 0026.
    id: str = Field(default_factory=new_id, primary_key=True)
    environment_version_id: str = Field(foreign_key="environment_version.id", index=True)
    seed: int
    item: dict[str, Any] | None = json_field(nullable=True)  # dataset row / generated problem
    content_digest: str | None = Field(
        default=None, description="sha256 of the rendered initial state and fixture bytes")
    tags: dict[str, Any] = json_field()  # domain, capability, difficulty, ...
    status: str = Field(default="pending", description="pending | admitted | rejected")
    evidence: dict[str, Any] = json_field()
    decided_by: str | None = None
    decided_at: datetime | None = timestamp_field()
    created_at: datetime = created_at_field()


class TaskSet(SQLModel, table=True):
    """A versioned collection of tasks of one environment version, admitted as one unit.

    id = sha256 of its manifest (environment version, source, split rule, tags and each
    task's content digest and split), so the same content registered twice is one set.
    """

    __tablename__ = "task_set"
    __table_args__ = (UniqueConstraint("name", "version"),)
    id: str = Field(primary_key=True, description="sha256 of the manifest")
    name: str
    version: int
    environment_version_id: str = Field(foreign_key="environment_version.id", index=True)
    source_kind: str = Field(description="dataset | generator | seeds | single")
    source: dict[str, Any] = json_field()
    split_rule: dict[str, Any] = json_field()
    tags: dict[str, Any] = json_field()
    status: str = Field(default="pending", description="pending | admitted | rejected")
    evidence: dict[str, Any] = json_field()
    decided_by: str | None = None
    decided_at: datetime | None = timestamp_field()
    created_by: str
    created_at: datetime = created_at_field()


class TaskSetMember(SQLModel, table=True):
    """A task in a set, in one split; a content digest appears once per set (0026)."""

    __tablename__ = "task_set_member"
    task_set_id: str = Field(foreign_key="task_set.id", primary_key=True)
    task_id: str = Field(primary_key=True)
    ordinal: int
    split: str = Field(description="train | eval | traffic")
    content_digest: str
