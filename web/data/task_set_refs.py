"""What names a task set (``NAME@V``, ``NAME`` for its newest version, a unique id prefix)
and which tasks one of its splits holds: how runs and eval sets name tasks by set and split.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlmodel import Session, col, select

from triloop.models import TaskSet, TaskSetMember

_HEX_PREFIX = re.compile(r"^[0-9a-f]{6,64}$")
_NAME_AT_VERSION = re.compile(r"^(?P<name>[^@]+)@(?P<version>[0-9]{1,9})$")


@dataclass(frozen=True)
class TaskSetRef:
    """A task set a reference named, or the problem with the reference."""

    task_set: TaskSet | None
    problem: str | None = None


def find_task_set(*, session: Session, ref: str) -> TaskSetRef:
    """The task set ``ref`` names: ``NAME@V``, ``NAME`` (its newest version), its id, or a
    unique prefix of its id (6+ hex digits); otherwise the problem, naming ``ref``."""
    by_id = session.get(TaskSet, ref)
    if by_id is not None:
        return TaskSetRef(by_id)
    pinned = _NAME_AT_VERSION.match(ref)
    if pinned is not None:
        found = session.exec(select(TaskSet).where(
            TaskSet.name == pinned["name"], TaskSet.version == int(pinned["version"]))).first()
        if found is not None:
            return TaskSetRef(found)
        return TaskSetRef(None, f"task set {ref!r}: no version {pinned['version']} of a task"
                                f" set named {pinned['name']!r}")
    newest = session.exec(select(TaskSet).where(TaskSet.name == ref)
                          .order_by(col(TaskSet.version).desc())).first()
    if newest is not None:
        return TaskSetRef(newest)
    if _HEX_PREFIX.match(ref):
        matches = list(session.exec(select(TaskSet).where(col(TaskSet.id).startswith(ref))
                                    .order_by(col(TaskSet.id)).limit(4)))
        if len(matches) == 1:
            return TaskSetRef(matches[0])
        if matches:
            return TaskSetRef(None, f"task set {ref!r} is the start of several task set ids"
                                    f" ({', '.join(m.id[:16] for m in matches)}...); give more"
                                    " of it")
    return TaskSetRef(None, f"task set {ref!r} names no registered task set (by NAME@V, name"
                            " or unique id prefix); `triloop governance task-set list` shows"
                            " them")


def split_task_ids(*, session: Session, task_set_id: str, split: str) -> list[str]:
    """The tasks of one split of a set, in ordinal order."""
    return list(session.exec(
        select(TaskSetMember.task_id).where(TaskSetMember.task_set_id == task_set_id,
                                            TaskSetMember.split == split)
        .order_by(col(TaskSetMember.ordinal))))


@dataclass(frozen=True)
class SplitTasks:
    """The tasks one reference to a set's split names, or why it may not be used."""

    task_set_id: str | None
    task_ids: list[str]
    problem: str | None = None


def split_for(*, session: Session, ref: str, split: str, allowed: str, use: str) -> SplitTasks:
    """The tasks of ``split`` of the set ``ref`` names, for ``use`` (``training``,
    ``an eval set``): refused unless the set is admitted and ``split`` is ``allowed``."""
    found = find_task_set(session=session, ref=ref)
    task_set = found.task_set
    if task_set is None:
        return SplitTasks(None, [], found.problem)
    named = f"task set {ref!r} ({task_set.name} v{task_set.version}, {task_set.id[:12]})"
    if split != allowed:
        held = {"eval": "held out for evaluation", "traffic": "held out for production traffic",
                "train": "for training"}.get(split, "not a split")
        return SplitTasks(task_set.id, [], f"{named}: split {split!r} is {held}; {use} takes"
                                           f" split {allowed!r} only")
    if task_set.status != "admitted":
        return SplitTasks(task_set.id, [], f"{named} is {task_set.status}, not admitted;"
                                           " `triloop governance task-set admit` decides it")
    task_ids = split_task_ids(session=session, task_set_id=task_set.id, split=split)
    if not task_ids:
        return SplitTasks(task_set.id, [], f"{named} has no tasks in split {split!r}")
    return SplitTasks(task_set.id, task_ids)
