"""Task sets for tests, inserted as the owner: a set, its tasks (with content digests) and
its members, as registration (``TaskSetRegistration``) would leave them."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Engine

from tests.factories import insert, make_environment_version, uid


@dataclass(frozen=True)
class TaskSetRows:
    """What ``make_task_set`` inserted."""

    id: str
    name: str
    version: int
    environment_version_id: str
    task_ids: list[str]  # in ordinal order
    splits: list[str]  # each task's split, in the same order

    def split(self, name: str) -> list[str]:
        """The tasks of one split, in ordinal order."""
        return [t for t, s in zip(self.task_ids, self.splits, strict=True) if s == name]


def make_task_set(
    owner: Engine, *, splits: Sequence[str] = ("train", "train", "train"),
    status: str = "pending", task_status: str = "pending", name: str | None = None,
    version: int = 1, evidence: dict[str, object] | None = None,
) -> TaskSetRows:
    """A task set of one task per entry of ``splits`` (in that split), on a fresh
    environment version; the set and its tasks in ``status`` and ``task_status``."""
    version_id = make_environment_version(owner)
    set_id = hashlib.sha256(uuid.uuid4().bytes).hexdigest()
    set_name = name or uid("ts-")
    insert(owner, "task_set", id=set_id, name=set_name, version=version,
           environment_version_id=version_id, source_kind="seeds",
           source={"seeds": list(range(len(splits)))}, split_rule={"by": "list"},
           status=status, evidence=evidence or {}, created_by="test")
    task_ids = []
    for ordinal, split in enumerate(splits):
        task_id = uid("task-")
        digest = hashlib.sha256(f"{set_id}:{ordinal}".encode()).hexdigest()
        insert(owner, "task", id=task_id, environment_version_id=version_id, seed=ordinal,
               status=task_status, evidence={}, content_digest=digest)
        insert(owner, "task_set_member", task_set_id=set_id, task_id=task_id,
               ordinal=ordinal, split=split, content_digest=digest)
        task_ids.append(task_id)
    return TaskSetRows(id=set_id, name=set_name, version=version,
                       environment_version_id=version_id, task_ids=task_ids,
                       splits=list(splits))
