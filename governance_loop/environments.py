"""Environment versions: a canonical contract becomes an immutable ``environment_version`` row.

A version's id is the sha256 of the contract's canonical form (contract, fixture
hashes, and the hashes of the source files implementing the environment and its
verifier: ``triloop.environment_code``), so registering identical content again
returns the version that already exists; any change, reward logic included, is a
new version, numbered 1, 2, ... per environment. The version also pins the verifier
hash that admission must then observe. Retiring a version stops new tasks and runs
on it; nothing that already used it changes, so its lineage stays intact.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from governance_loop import store
from triloop.artifacts import ArtifactStore
from triloop.audit import append_event
from triloop.contract_diff import ContractChange, diff_contracts
from triloop.db import session_scope
from triloop.fixture_store import publish_fixtures
from triloop.models import EnvironmentVersion, Task
from triloop.models._columns import utcnow
from triloop.policy import Actor, Authorizer, Resource
from triloop.statuses import TaskStatus

GOVERNANCE = Actor(service="governance")


def requested_by_context(user: str, roles: Sequence[str]) -> dict[str, Any]:
    """Context naming the person behind a governance action (audited with the decision).

    Not ``on_behalf_of``: the policy lets a person delegate only release decisions to
    a loop; versioning is the governance service's own grant, taken at a person's request.
    """
    return {"requested_by": {"user": user, "roles": list(roles)}}


@dataclass(frozen=True)
class ContractDocument:
    """A validated contract ready to register: its canonical JSON, text, fixtures and id."""

    name: str  # environment name
    contract: dict[str, Any]
    contract_text: str
    fixture_hashes: dict[str, str]
    version_id: str  # sha256 of the canonical form
    code_hashes: dict[str, str] = field(default_factory=dict)  # source file -> sha256
    verifier_hash: str | None = None  # what admission's probe must observe
    # Each fixture file's bytes (published to the artifact store at registration); not
    # part of the identity, which pins their hashes.
    fixture_files: dict[str, bytes] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class RegisteredVersion:
    """Where a contract landed: its version row, and whether this call created it."""

    id: str
    environment_name: str
    version: int
    created: bool
    retired: bool = False


def document_from_file(path: Path, *, name: str | None = None) -> ContractDocument:
    """Load, validate and identify a contract file (fixtures and code hashed from disk).

    Raises ``EnvironmentCodeError`` for a task with no implementation to hash.
    """
    from triloop.contracts import contract_id, fixture_hashes, load_contract
    from triloop.environment_code import environment_code_hashes, environment_verifier_hash

    contract = load_contract(path)
    hashes = fixture_hashes(contract)
    served = contract.service is not None
    hooks = contract.hooks.modules() if contract.hooks else []
    code = environment_code_hashes(contract.task, service=served, hooks=hooks)
    return ContractDocument(
        name=name or contract.task, contract=contract.model_dump(mode="json"),
        contract_text=path.read_text(encoding="utf-8"), fixture_hashes=dict(hashes),
        version_id=contract_id(contract, hashes, code), code_hashes=code,
        verifier_hash=environment_verifier_hash(contract.task, service=served),
        fixture_files={name: (path.parent / name).read_bytes() for name in hashes},
    )


class ServiceRegistrationError(ValueError):
    """A served contract's service is unreachable, or not the one the contract pins."""

    def __init__(self, name: str, problems: Sequence[str]) -> None:
        super().__init__(f"environment {name!r} cannot be registered: " + "; ".join(problems))
        self.problems = list(problems)


def check_served(document: ContractDocument) -> None:
    """Ask a served contract's service for ``GET /info`` and refuse it if it does not match.

    Governance contacts the service itself, read-only, through the kernel's check on the
    protocol's standalone models (``triloop.service_contact``): it pins the verifier digest,
    so it checks the digest is what the service declares. Nothing of the environment runs
    here; the execution loop checks again each time it opens it.
    """
    from triloop.contracts import EnvironmentContract
    from triloop.service_contact import contact_problems

    if not document.contract.get("service"):
        return
    problems = contact_problems(EnvironmentContract.model_validate(document.contract))
    if problems:
        raise ServiceRegistrationError(document.name, [str(p) for p in problems])


def _registered(row: EnvironmentVersion, *, created: bool) -> RegisteredVersion:
    return RegisteredVersion(
        id=row.id, environment_name=row.environment_name, version=row.version,
        created=created, retired=row.retired_at is not None,
    )


def register_environment_version(
    *, engine: Engine, authorizer: Authorizer, document: ContractDocument, requested_by: str,
    roles: Sequence[str] = (), fixtures: ArtifactStore | None = None,
) -> RegisteredVersion:
    """Register a contract as the next version of its environment (identical content: same).

    A served contract's service must answer ``GET /info`` as the contract pins it
    (``ServiceRegistrationError`` otherwise, nothing written).
    """
    with session_scope(engine) as session:
        existing = session.get(EnvironmentVersion, document.version_id)
        if existing is not None:
            return _registered(existing, created=False)
    authorizer.authorize(
        GOVERNANCE, "create", version_resource(document),
        context=requested_by_context(requested_by, roles),
    )
    check_served(document)
    return store_environment_version(engine=engine, document=document,
                                     requested_by=requested_by, fixtures=fixtures)


def version_resource(document: ContractDocument) -> Resource:
    """The environment version a registration creates, as the policy sees it."""
    return Resource("environment_version", id=document.version_id,
                    attrs={"environment": document.name})


def store_environment_version(
    *, engine: Engine, document: ContractDocument, requested_by: str,
    decision_id: str | None = None, fixtures: ArtifactStore | None = None,
) -> RegisteredVersion:
    """Write the version row (the caller authorized it); identical content: the stored one.

    With ``fixtures``, each fixture file's bytes go to that artifact store first (by the
    hash the version pins), so the execution loop can run exactly what was uploaded.
    """
    if fixtures is not None:
        publish_fixtures(fixtures, document.fixture_files, document.fixture_hashes)
    try:
        with session_scope(engine) as session:
            existing = session.get(EnvironmentVersion, document.version_id)
            if existing is not None:
                return _registered(existing, created=False)
            store.ensure_environment(session=session, name=document.name, created_by=requested_by)
            row = EnvironmentVersion(
                id=document.version_id, environment_name=document.name,
                version=store.next_environment_version(session=session, name=document.name),
                contract=document.contract, contract_text=document.contract_text,
                fixture_hashes=document.fixture_hashes, code_hashes=document.code_hashes,
                verifier_hash=document.verifier_hash, created_by=requested_by,
            )
            session.add(row)
            session.flush()
            _record(session, "register_environment_version", row, requested_by,
                    decision_id=decision_id)
            return _registered(row, created=True)
    except IntegrityError:
        # Someone registered the same content meanwhile: that version is ours too.
        with session_scope(engine) as session:
            existing = session.get(EnvironmentVersion, document.version_id)
            if existing is None:
                raise
            return _registered(existing, created=False)


def retire_environment_version(
    *, engine: Engine, authorizer: Authorizer, version_id: str, requested_by: str,
    roles: Sequence[str] = (),
) -> RegisteredVersion:
    """Retire a version: no new tasks or runs on it; past runs keep their lineage."""
    with session_scope(engine) as session:
        row = store.get_environment_version(session=session, version_id=version_id)
        if row.retired_at is not None:
            return _registered(row, created=False)
    authorizer.authorize(
        GOVERNANCE, "retire", Resource("environment_version", id=version_id),
        context=requested_by_context(requested_by, roles),
    )
    with session_scope(engine) as session:
        row = store.get_environment_version(session=session, version_id=version_id)
        row.retired_at = utcnow()
        row.retired_by = requested_by
        session.add(row)
        _record(session, "retire_environment_version", row, requested_by)
        return _registered(row, created=False)


def add_task(
    *, engine: Engine, authorizer: Authorizer, version_ref: str, seed: int, requested_by: str,
    roles: Sequence[str] = (),
) -> str:
    """A pending task on a live version (the same version and seed return the same task)."""
    with session_scope(engine) as session:
        version = resolve_version(session, version_ref)
        if version.retired_at is not None:
            raise store.StoreError(f"environment version {version.id} is retired: no new tasks")
        existing = session.exec(
            select(Task).where(Task.environment_version_id == version.id, Task.seed == seed,
                              col(Task.item).is_(None))
        ).first()
        if existing is not None:
            return existing.id
    authorizer.authorize(
        GOVERNANCE, "create", Resource("task", attrs={"environment_version_id": version.id}),
        context=requested_by_context(requested_by, roles),
    )
    with session_scope(engine) as session:
        task = Task(environment_version_id=version.id, seed=seed, status=TaskStatus.pending)
        session.add(task)
        session.flush()
        append_event(session, actor=GOVERNANCE.to_input(), action="add_task",
                     resource={"kind": "task", "id": task.id}, decision="record",
                     payload={"environment_version_id": version.id, "seed": seed,
                              "requested_by": requested_by})
        return task.id


def resolve_version(session: Session, ref: str) -> EnvironmentVersion:
    """A version by id, by ``name@N``, or the newest version of ``name``."""
    row = session.get(EnvironmentVersion, ref)
    if row is not None:
        return row
    name, _, number = ref.partition("@")
    if number:
        found = store.find_environment_version(
            session=session, name=name, version=int(number.lstrip("v"))
        )
    else:
        found = store.latest_environment_version(session=session, name=name)
    if found is None:
        raise store.StoreError(
            f"no environment version {ref!r}: give a version id, NAME@N or an environment name"
        )
    return found


def comparable(
    contract: Mapping[str, Any],
    fixture_hashes: Mapping[str, Any],
    code_hashes: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """What a diff compares: the contract, its fixtures' hashes and its code's hashes."""
    return {**contract, "fixture_hashes": dict(fixture_hashes),
            "code_hashes": dict(code_hashes or {})}


def diff_versions(*, engine: Engine, a: str, b: str) -> list[ContractChange]:
    """Every difference between two registered versions (ids or ``name@N``)."""
    with session_scope(engine) as session:
        first, second = resolve_version(session, a), resolve_version(session, b)
        return diff_contracts(
            comparable(first.contract, first.fixture_hashes, first.code_hashes),
            comparable(second.contract, second.fixture_hashes, second.code_hashes),
        )


def _record(session: Session, action: str, row: EnvironmentVersion, user: str, *,
            decision_id: str | None = None) -> None:
    payload: dict[str, Any] = {"environment": row.environment_name, "version": row.version,
                               "requested_by": user}
    if decision_id:
        payload["human_decision_id"] = decision_id
    append_event(
        session, actor=GOVERNANCE.to_input(), action=action,
        resource={"kind": "environment_version", "id": row.id}, decision="record",
        payload=payload,
    )
