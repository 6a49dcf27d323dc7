"""Environments, their immutable versions (contracts), and tasks with admission evidence."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict
from sqlalchemy import func
from sqlmodel import Session, col, select

from triloop.contract_diff import ContractChange, diff_contracts
from triloop.models import Environment, EnvironmentVersion, Task
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


class TaskPublic(BaseModel):
    """A task and the evidence behind its admission decision (the four questions)."""

    model_config = ConfigDict(from_attributes=True)
    id: str
    environment_version_id: str
    seed: int
    status: str
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


def list_tasks(
    *, session: Session, limit: int, cursor: str | None,
    environment_version_id: str | None = None, status: str | None = None,
) -> Page[TaskPublic]:
    """Tasks, newest first, optionally of one version or status."""
    statement = select(Task)
    if environment_version_id is not None:
        statement = statement.where(Task.environment_version_id == environment_version_id)
    if status is not None:
        statement = statement.where(Task.status == status)
    statement = keyset(statement, [col(Task.created_at), col(Task.id)], cursor,
                       (datetime, str), limit)
    rows = list(session.exec(statement))
    return page_of(rows, limit, lambda t: (t.created_at, t.id), TaskPublic.model_validate)


def get_task(*, session: Session, task_id: str) -> TaskPublic | None:
    """One task with its evidence."""
    task = session.get(Task, task_id)
    return None if task is None else TaskPublic.model_validate(task)
