"""Environments, their immutable versions (contracts), and tasks with admission evidence."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict
from sqlalchemy import func
from sqlmodel import Session, col, select

from triloop.contract_diff import ContractChange, diff_contracts
from triloop.id_prefix import IdMatch, unmatched_message
from triloop.models import (
    Environment,
    EnvironmentVersion,
    EvalItem,
    EvalSet,
    Task,
    TaskSet,
    TaskSetMember,
)
from web.id_refs import resolve_ref
from web.pagination import Page, keyset, page_of


class EnvironmentPublic(BaseModel):
    """A named environment and how many versions it has."""

    name: str
    description: str
    created_by: str
    created_at: datetime
    version_count: int


class VersionSummary(BaseModel):
    """An environment version; id is the sha256 of its canonical contract."""

    model_config = ConfigDict(from_attributes=True)
    id: str
    environment_name: str
    version: int
    created_by: str
    created_at: datetime
    retired_at: datetime | None = None
    retired_by: str | None = None


class VersionDetail(VersionSummary):
    """A version with its contract, fixture hashes and task counts by status."""

    contract: dict[str, Any]
    contract_text: str
    fixture_hashes: dict[str, Any]
    task_counts: dict[str, int]


class EnvironmentDetail(EnvironmentPublic):
    """An environment with all its versions, newest first."""

    versions: list[VersionSummary]


class ContractDiff(BaseModel):
    """The changes from version A to version B."""

    a: VersionSummary
    b: VersionSummary
    changes: list[ContractChange]


class TaskMembership(BaseModel):
    """A task set the task is in, and its split there."""

    task_set_id: str
    task_set: str  # name@version
    split: str


class TaskPublic(BaseModel):
    """A task and the evidence behind its admission decision (the four questions), with its
    environment, the splits of the task sets it is in, and its tags."""

    model_config = ConfigDict(from_attributes=True)
    id: str
    environment_version_id: str
    environment: str = ""  # the version's environment name
    environment_version: int | None = None  # its version number
    seed: int
    status: str
    content_digest: str | None = None
    tags: dict[str, str] = {}
    splits: list[TaskMembership] = []
    # Frozen eval sets (NAME@vN) that hold the task out of training: a run naming it (or a
    # task of the same content) is refused.
    held_out_in: list[str] = []
    evidence: dict[str, Any]
    decided_by: str | None = None
    decided_at: datetime | None = None
    created_at: datetime


def _counts(session: Session, names: list[str]) -> dict[str, int]:
    rows = session.exec(
        select(EnvironmentVersion.environment_name, func.count())
        .where(col(EnvironmentVersion.environment_name).in_(names))
        .group_by(EnvironmentVersion.environment_name)
    )
    return {name: int(count) for name, count in rows}


def _contract_descriptions(session: Session, names: list[str]) -> dict[str, str]:
    """Each environment's description as its latest contract version states it."""
    found: dict[str, str] = {}
    rows = session.exec(
        select(EnvironmentVersion.environment_name, EnvironmentVersion.contract)
        .where(col(EnvironmentVersion.environment_name).in_(names))
        .order_by(col(EnvironmentVersion.version))
    )
    for name, contract in rows:
        text = (contract or {}).get("description") if isinstance(contract, dict) else None
        if isinstance(text, str) and text.strip():
            found[name] = text.strip()
    return found


def _public(env: Environment, count: int, described: Mapping[str, str]) -> EnvironmentPublic:
    # Registration writes the description into the contract, not always onto the
    # environment row: fall back to the newest contract's, so a list never shows "—" for it.
    return EnvironmentPublic(name=env.name,
                             description=env.description or described.get(env.name, ""),
                             created_by=env.created_by, created_at=env.created_at,
                             version_count=count)


def list_environments(
    *, session: Session, limit: int, cursor: str | None
) -> Page[EnvironmentPublic]:
    """Environments, newest first."""
    statement = keyset(select(Environment), [col(Environment.created_at), col(Environment.name)],
                       cursor, (datetime, str), limit)
    rows = list(session.exec(statement))
    names = [e.name for e in rows]
    counts = _counts(session, names)
    described = _contract_descriptions(session, names)
    return page_of(rows, limit, lambda e: (e.created_at, e.name),
                   lambda e: _public(e, counts.get(e.name, 0), described))


def environment_detail(*, session: Session, name: str) -> EnvironmentDetail | None:
    """One environment with its versions."""
    env = session.get(Environment, name)
    if env is None:
        return None
    versions = list(session.exec(
        select(EnvironmentVersion).where(EnvironmentVersion.environment_name == name)
        .order_by(col(EnvironmentVersion.version).desc())
    ))
    return EnvironmentDetail(
        **_public(env, len(versions), _contract_descriptions(session, [name])).model_dump(),
        versions=[VersionSummary.model_validate(v) for v in versions],
    )


def version_detail(*, session: Session, version_id: str) -> VersionDetail | None:
    """One version with its contract and task counts."""
    version = session.get(EnvironmentVersion, version_id)
    if version is None:
        return None
    counts = session.exec(
        select(Task.status, func.count()).where(Task.environment_version_id == version_id)
        .group_by(Task.status)
    )
    return VersionDetail(
        **VersionSummary.model_validate(version).model_dump(),
        contract=version.contract, contract_text=version.contract_text,
        fixture_hashes=version.fixture_hashes,
        task_counts={status: int(n) for status, n in counts},
    )


def version_by_number(*, session: Session, name: str, version: int) -> EnvironmentVersion | None:
    """The version row with this number of an environment."""
    return session.exec(
        select(EnvironmentVersion).where(EnvironmentVersion.environment_name == name,
                                         EnvironmentVersion.version == version)
    ).first()


def contract_diff(*, session: Session, name: str, a: int, b: int) -> ContractDiff | None:
    """Diff of two versions of one environment (contract and code); None when one is missing."""
    first = version_by_number(session=session, name=name, version=a)
    second = version_by_number(session=session, name=name, version=b)
    if first is None or second is None:
        return None
    return ContractDiff(
        a=VersionSummary.model_validate(first), b=VersionSummary.model_validate(second),
        changes=diff_contracts(
            {**first.contract, "code_hashes": dict(first.code_hashes or {})},
            {**second.contract, "code_hashes": dict(second.code_hashes or {})},
        ),
    )


def resolve_task_ref(*, session: Session, ref: str) -> IdMatch:
    """A task id, else the one id ``ref`` starts; an ambiguous prefix lists candidates."""
    return resolve_ref(session=session, id_column=Task.id, ref=ref)


def resolve_task_refs(*, session: Session, refs: list[str]) -> tuple[list[str], list[str]]:
    """(ids in order, problems): each ref an id or a unique prefix of one becomes that id;
    an ambiguous prefix is a problem naming the candidates; a ref naming nothing is kept
    as it is, for the caller's own "no such task"."""
    resolved, problems = [], []
    for ref in refs:
        found = resolve_task_ref(session=session, ref=ref)
        resolved.append(found.id or ref)
        if found.ambiguous:
            problems.append(unmatched_message(found, "task"))
    return resolved, problems


def _memberships(session: Session, task_ids: list[str]) -> dict[str, list[TaskMembership]]:
    found: dict[str, list[TaskMembership]] = {}
    if not task_ids:
        return found
    rows = session.exec(
        select(TaskSetMember, TaskSet)
        .join(TaskSet, col(TaskSet.id) == col(TaskSetMember.task_set_id))
        .where(col(TaskSetMember.task_id).in_(task_ids))
        .order_by(col(TaskSet.name), col(TaskSet.version))
    )
    for member, task_set in rows:
        found.setdefault(member.task_id, []).append(TaskMembership(
            task_set_id=task_set.id, task_set=f"{task_set.name}@{task_set.version}",
            split=member.split))
    return found


def _held_out_in(session: Session, task_ids: list[str]) -> dict[str, list[str]]:
    """Each task's frozen eval sets, as NAME@vN."""
    found: dict[str, list[str]] = {}
    if not task_ids:
        return found
    rows = session.exec(
        select(EvalItem.task_id, EvalSet.name, EvalSet.version)
        .join(EvalSet, col(EvalSet.id) == col(EvalItem.eval_set_id))
        .where(col(EvalItem.task_id).in_(task_ids), col(EvalSet.frozen_at).is_not(None))
        .order_by(col(EvalSet.name), col(EvalSet.version)))
    for task_id, name, version in rows:
        found.setdefault(task_id, []).append(f"{name}@v{version}")
    return found


def _task_publics(session: Session, tasks: list[Task]) -> list[TaskPublic]:
    versions = {v.id: v for v in session.exec(select(EnvironmentVersion).where(
        col(EnvironmentVersion.id).in_({t.environment_version_id for t in tasks})))}
    splits = _memberships(session, [t.id for t in tasks])
    held_out = _held_out_in(session, [t.id for t in tasks])
    publics = []
    for task in tasks:
        version = versions.get(task.environment_version_id)
        publics.append(TaskPublic.model_validate({
            **task.model_dump(), "tags": {str(k): str(v) for k, v in (task.tags or {}).items()},
            "environment": version.environment_name if version else "",
            "environment_version": version.version if version else None,
            "splits": splits.get(task.id, []), "held_out_in": held_out.get(task.id, []),
        }))
    return publics


def parse_tag_filters(values: list[str]) -> tuple[dict[str, str], list[str]]:
    """``key=value`` filters as a dict, and the ones that are not ``key=value``."""
    tags: dict[str, str] = {}
    bad: list[str] = []
    for value in values:
        key, sep, wanted = value.partition("=")
        if not sep or not key or not wanted:
            bad.append(f"tag {value!r}: expected key=value, for example difficulty=easy")
        else:
            tags[key] = wanted
    return tags, bad


def list_tasks(
    *, session: Session, limit: int, cursor: str | None,
    environment_version_id: str | None = None, status: str | None = None,
    environment: str | None = None, split: str | None = None,
    tags: Mapping[str, str] | None = None, id_prefix: str | None = None,
) -> Page[TaskPublic]:
    """Tasks, newest first, optionally of one version, environment, status or split (in
    any task set), carrying all these tags, or whose id starts so."""
    statement = select(Task)
    if id_prefix is not None:
        statement = statement.where(col(Task.id).startswith(id_prefix, autoescape=True))
    if environment_version_id is not None:
        statement = statement.where(Task.environment_version_id == environment_version_id)
    if environment is not None:
        of_environment = select(EnvironmentVersion.id).where(
            EnvironmentVersion.environment_name == environment)
        statement = statement.where(col(Task.environment_version_id).in_(of_environment))
    if status is not None:
        statement = statement.where(Task.status == status)
    if split is not None:
        statement = statement.where(col(Task.id).in_(
            select(TaskSetMember.task_id).where(TaskSetMember.split == split)))
    if tags:
        statement = statement.where(col(Task.tags).contains(dict(tags)))
    statement = keyset(statement, [col(Task.created_at), col(Task.id)], cursor,
                       (datetime, str), limit)
    rows = list(session.exec(statement))
    # One query per page for environments and memberships, not one per task.
    publics = {p.id: p for p in _task_publics(session, rows[:limit])}
    return page_of(rows, limit, lambda t: (t.created_at, t.id), lambda t: publics[t.id])


def get_task(*, session: Session, task_id: str) -> TaskPublic | None:
    """One task with its evidence, environment, splits and tags."""
    task = session.get(Task, task_id)
    return None if task is None else _task_publics(session, [task])[0]
