"""Reads of task sets: newest first, each with its members per split."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import text
from sqlmodel import Session, col, select

from triloop.models import TaskSet
from web.pagination import Page, keyset, page_of

MIN_PREFIX = 6  # characters of an id a person may type for it


class TaskSetPublic(BaseModel):
    """A task set: where its tasks come from, how they are split, and its admission."""

    model_config = ConfigDict(from_attributes=True)
    id: str
    name: str
    version: int
    environment_version_id: str
    source_kind: str
    source: dict[str, Any]
    split_rule: dict[str, Any]
    tags: dict[str, Any]
    status: str
    decided_by: str | None = None
    decided_at: datetime | None = None
    created_by: str
    created_at: datetime
    splits: dict[str, int] = Field(default_factory=dict, description="members per split")


class TaskSetMemberPublic(BaseModel):
    """One member: its task, split, digest, seed and tags."""

    ordinal: int
    task_id: str
    split: str
    content_digest: str
    seed: int
    task_status: str
    tags: dict[str, Any]


class TaskSetDetail(TaskSetPublic):
    """A task set with its admission evidence and its first members."""

    environment: str
    environment_version: int
    evidence: dict[str, Any]
    members: list[TaskSetMemberPublic]
    members_shown: int = Field(description="members listed here (the first, by ordinal)")


def _splits(session: Session, ids: list[str]) -> dict[str, dict[str, int]]:
    rows = session.execute(text(
        "SELECT task_set_id, split, count(*) FROM task_set_member "
        "WHERE task_set_id = ANY(:ids) GROUP BY task_set_id, split"), {"ids": ids}).all()
    counts: dict[str, dict[str, int]] = {}
    for set_id, split, count in rows:
        counts.setdefault(str(set_id), {})[str(split)] = int(count)
    return counts


def _public(row: TaskSet, splits: dict[str, int]) -> TaskSetPublic:
    return TaskSetPublic.model_validate({**row.model_dump(), "splits": splits})


def list_task_sets(*, session: Session, limit: int, cursor: str | None,
                   name: str | None = None) -> Page[TaskSetPublic]:
    """Task sets, newest first (of one name, when given)."""
    base = select(TaskSet)
    if name is not None:
        base = base.where(TaskSet.name == name)
    statement = keyset(base, [col(TaskSet.created_at), col(TaskSet.id)], cursor,
                       (datetime, str), limit)
    rows = list(session.exec(statement))
    splits = _splits(session, [r.id for r in rows])
    return page_of(rows, limit, lambda r: (r.created_at, r.id),
                   lambda r: _public(r, splits.get(r.id, {})))


class AmbiguousTaskSet(LookupError):
    """A prefix that names more than one set; the message lists them."""


def resolve_task_set(session: Session, ref: str) -> TaskSet | None:
    """A set by id, NAME@V, NAME (its newest version) or a unique id prefix."""
    row = session.get(TaskSet, ref)
    if row is not None:
        return row
    name, _, version = ref.partition("@")
    if version:
        return session.exec(select(TaskSet).where(
            TaskSet.name == name, TaskSet.version == int(version.lstrip("v")))).first() if (
            version.lstrip("v").isdigit()) else None
    newest = session.exec(select(TaskSet).where(TaskSet.name == ref)
                          .order_by(col(TaskSet.version).desc())).first()
    if newest is not None:
        return newest
    if len(ref) < MIN_PREFIX or not all(c in "0123456789abcdef" for c in ref):
        return None
    found = list(session.exec(select(TaskSet).where(col(TaskSet.id).startswith(ref)).limit(5)))
    if len(found) > 1:
        raise AmbiguousTaskSet(f"task set prefix {ref!r} names more than one set: "
                               + ", ".join(f"{r.id[:12]} ({r.name}@{r.version})" for r in found))
    return found[0] if found else None


def task_set_detail(*, session: Session, ref: str, members: int = 100) -> TaskSetDetail | None:
    """One set with its evidence and its first ``members`` members."""
    row = resolve_task_set(session, ref)
    if row is None:
        return None
    version = session.execute(text(
        "SELECT environment_name, version FROM environment_version WHERE id = :v"),
        {"v": row.environment_version_id}).one()
    shown = session.execute(text(
        "SELECT m.ordinal, m.task_id, m.split, m.content_digest, t.seed, t.status, t.tags "
        "FROM task_set_member m JOIN task t ON t.id = m.task_id "
        "WHERE m.task_set_id = :s ORDER BY m.ordinal LIMIT :n"),
        {"s": row.id, "n": members}).all()
    return TaskSetDetail.model_validate({
        **row.model_dump(), "splits": _splits(session, [row.id]).get(row.id, {}),
        "environment": str(version[0]), "environment_version": int(version[1]),
        "members": [TaskSetMemberPublic(ordinal=int(m[0]), task_id=str(m[1]), split=str(m[2]),
                                        content_digest=str(m[3]), seed=int(m[4]),
                                        task_status=str(m[5]), tags=dict(m[6] or {}))
                    for m in shown],
        "members_shown": len(shown)})
