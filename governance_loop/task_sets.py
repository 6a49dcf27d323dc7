"""Task sets: a registered source's tasks, split and tagged, written in one transaction.

The execution loop described every task (``describe_tasks``: its content digest and tags);
here governance splits them by the set's rule, refuses a digest that appears twice (the
same item in two splits, or twice in one, named by ordinal), and writes the set, its tasks
and its members at once, audited with the operator's decision. A task already on the
version with the same seed and item is reused (its digest recorded if it had none), so a
task belongs to many sets but exists once. The set's id is the sha256 of its manifest
(environment version, source, split rule, tags, and each member's ordinal, seed, digest and
split): the same content registered again is the set that already holds it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, func, text
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from governance_loop.environments import GOVERNANCE, resolve_version
from triloop.audit import append_event
from triloop.db import session_scope
from triloop.models import Task, TaskSet, TaskSetMember
from triloop.statuses import TaskStatus
from triloop.task_sources import (
    TaskSourceError,
    assign_splits,
    duplicated_digests,
    split_rule_problems,
)
from triloop.workflow_api import DescribedTask

SOURCE_KINDS = ("dataset", "generator", "seeds")


class TaskSetError(ValueError):
    """The set cannot be registered; ``problems`` names each reason (nothing was written)."""

    def __init__(self, summary: str, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__(f"{summary}: {'; '.join(self.problems[:20])}")


@dataclass(frozen=True)
class StoredTaskSet:
    """Where a registration landed: the set, its version, and its members per split."""

    id: str
    name: str
    version: int
    created: bool
    splits: dict[str, int] = field(default_factory=dict)
    new_tasks: int = 0


def manifest_id(*, environment_version_id: str, source_kind: str, source: Mapping[str, Any],
                split_rule: Mapping[str, Any], tags: Mapping[str, str],
                members: Sequence[tuple[int, int, str, str]]) -> str:
    """sha256 of the set's manifest (members: ordinal, seed, digest, split)."""
    manifest = {"environment_version_id": environment_version_id, "source_kind": source_kind,
                "source": source, "split_rule": split_rule, "tags": tags,
                "members": [list(m) for m in members]}
    blob = json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _canonical(item: Mapping[str, Any] | None) -> str:
    return "" if item is None else json.dumps(item, sort_keys=True, separators=(",", ":"))


def store_task_set(
    *, engine: Engine, name: str, environment_version_id: str, source_kind: str,
    source: Mapping[str, Any], split_rule: Mapping[str, Any], tags: Mapping[str, str],
    described: Sequence[DescribedTask], items: Sequence[Mapping[str, Any] | None],
    requested_by: str, decision_id: str | None = None,
) -> StoredTaskSet:
    """Split, check and write the set, its tasks and members in one transaction."""
    if source_kind not in SOURCE_KINDS:
        raise TaskSetError("unknown source", [f"source kind {source_kind!r}"])
    problems = split_rule_problems(split_rule, source_kind=source_kind)
    if problems:
        raise TaskSetError("the split rule cannot be applied", problems)
    if not described:
        raise TaskSetError("the set has no tasks", ["the source described no task"])
    if len(items) != len(described):
        raise TaskSetError("the items do not match the described tasks", [
            f"{len(items)} items for {len(described)} tasks"])
    digests = [t.content_digest for t in described]
    try:
        splits = assign_splits(split_rule, digests, [t.split for t in described])
    except TaskSourceError as error:
        raise TaskSetError("the split rule cannot be applied", error.problems) from error
    repeated = duplicated_digests(digests, splits)
    if repeated:
        raise TaskSetError(f"{len(repeated)} content digest(s) appear more than once", repeated)
    members = [(t.ordinal, t.seed, t.content_digest, split)
               for t, split in zip(described, splits, strict=True)]
    set_id = manifest_id(environment_version_id=environment_version_id,
                         source_kind=source_kind, source=source, split_rule=split_rule,
                         tags=tags, members=members)
    counts = {split: splits.count(split) for split in sorted(set(splits))}
    try:
        with session_scope(engine) as session:
            done = session.get(TaskSet, set_id)
            if done is not None:
                return StoredTaskSet(done.id, done.name, done.version, False, counts)
            version = resolve_version(session, environment_version_id)
            if version.retired_at is not None:
                raise TaskSetError("the environment version is retired", [
                    f"{version.environment_name} v{version.version} takes no new tasks"])
            task_ids, new = _tasks(session, version.id, described, items, tags)
            latest = session.exec(select(func.max(TaskSet.version)).where(
                TaskSet.name == name)).one()
            row = TaskSet(id=set_id, name=name, version=int(latest or 0) + 1,
                          environment_version_id=version.id, source_kind=source_kind,
                          source=dict(source), split_rule=dict(split_rule), tags=dict(tags),
                          created_by=requested_by)
            session.add(row)
            session.flush()
            session.add_all([
                TaskSetMember(task_set_id=set_id, task_id=task_id, ordinal=ordinal,
                              split=split, content_digest=digest)
                for task_id, (ordinal, _, digest, split) in zip(task_ids, members, strict=True)])
            session.flush()
            append_event(session, actor=GOVERNANCE.to_input(), action="register_task_set",
                         resource={"kind": "task_set", "id": set_id}, decision="record",
                         payload={"name": name, "version": row.version,
                                  "environment_version_id": version.id,
                                  "source_kind": source_kind, "splits": counts,
                                  "new_tasks": new, "requested_by": requested_by,
                                  "human_decision_id": decision_id})
            return StoredTaskSet(set_id, name, row.version, True, counts, new)
    except IntegrityError as error:  # the database's backstop: a digest twice in one set
        raise TaskSetError("the database refused the set", [
            str(error.orig).splitlines()[0]]) from error


def _tasks(session: Session, version_id: str, described: Sequence[DescribedTask],
           items: Sequence[Mapping[str, Any] | None], set_tags: Mapping[str, str],
           ) -> tuple[list[str], int]:
    """Each described task's row id: the version's task with the same seed and item, else a
    new pending one; its digest recorded, its tags the environment's under the set's."""
    seeds = sorted({t.seed for t in described})
    existing: dict[tuple[int, str], Task] = {}
    for found in session.exec(select(Task).where(Task.environment_version_id == version_id,
                                                 Task.seed.in_(seeds))):  # type: ignore[attr-defined]
        existing[(found.seed, _canonical(found.item))] = found
    ids, new, problems = [], 0, []
    for task, item in zip(described, items, strict=True):
        tags = {**task.tags, **set_tags}
        row = existing.get((task.seed, _canonical(item)))
        if row is None:
            row = Task(environment_version_id=version_id, seed=task.seed,
                       item=None if item is None else dict(item),
                       content_digest=task.content_digest, tags=tags,
                       status=TaskStatus.pending)
            session.add(row)
            existing[(task.seed, _canonical(item))] = row
            new += 1
        elif row.content_digest is None:
            row.content_digest = task.content_digest
            row.tags = {**(row.tags or {}), **tags}
            session.add(row)
        elif row.content_digest != task.content_digest:
            problems.append(f"task {row.id} (ordinal {task.ordinal}, seed {task.seed}) has "
                            f"digest {row.content_digest}, described now as "
                            f"{task.content_digest}: the environment changed under its version")
        ids.append(row.id)
    if problems:
        raise TaskSetError("tasks changed content", problems)
    session.flush()
    return ids, new


def split_counts(session: Session, task_set_ids: Sequence[str]) -> dict[str, dict[str, int]]:
    """Members per split of each set."""
    rows = session.execute(text(
        "SELECT task_set_id, split, count(*) FROM task_set_member "
        "WHERE task_set_id = ANY(:ids) GROUP BY task_set_id, split"),
        {"ids": list(task_set_ids)}).all()
    counts: dict[str, dict[str, int]] = {}
    for set_id, split, count in rows:
        counts.setdefault(str(set_id), {})[str(split)] = int(count)
    return counts


__all__ = ["SOURCE_KINDS", "StoredTaskSet", "TaskSetError", "manifest_id", "split_counts",
           "store_task_set"]
