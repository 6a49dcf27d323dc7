"""Eval sets and thresholds: created, frozen and versioned by governance only.

An eval set version lists admitted tasks; freezing stores the sha256 of its
items (name, version, and each task's id, environment version and seed) and a
database trigger refuses any later change. A threshold version is a validated
``ThresholdSpec`` whose ``version`` field names ``NAME@vN``, so every gate
result says which bar it was held to.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine
from sqlmodel import Session

from governance_loop import store
from governance_loop.environments import GOVERNANCE, requested_by_context
from governance_loop.gates import ThresholdSpec
from triloop import held_out
from triloop.audit import append_event
from triloop.db import session_scope
from triloop.models import EnvironmentVersion, EvalItem, EvalSet, Task, Threshold
from triloop.models._columns import utcnow
from triloop.policy import Authorizer, Resource
from triloop.statuses import TaskStatus


class EvalSetError(ValueError):
    """An eval set or threshold request that cannot be honoured; the message says why."""


@dataclass(frozen=True)
class EvalSetVersion:
    """One version of a named eval set."""

    id: str
    name: str
    version: int
    content_hash: str | None
    task_ids: list[str]


@dataclass(frozen=True)
class ThresholdVersion:
    """One version of a named threshold and the frozen eval set it applies to."""

    id: str
    name: str
    version: int
    eval_set_id: str | None
    spec: dict[str, Any]
    eval_sets: dict[str, list[str]] | None = None  # environment -> its frozen eval sets


def eval_set_content_hash(name: str, version: int, items: Sequence[Task]) -> str:
    """sha256 over the set's identity and its items in order."""
    return _content_hash(name, version, [(t.id, t.seed, t.environment_version_id) for t in items])


def _content_hash(name: str, version: int, items: Sequence[tuple[str, int, str]]) -> str:
    document = {
        "name": name, "version": version,
        "items": [{"task_id": task_id, "environment_version_id": version_id, "seed": seed}
                  for task_id, seed, version_id in items],
    }
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def content_hash_problem(*, session: Session, eval_set: EvalSet) -> str | None:
    """Why a gate may not use this eval set (not frozen, or items changed since), or None.

    The hash is recomputed from the items and tasks as they are now, so an edit that
    got past the triggers (an owner who disabled them, a task's seed changed) is caught
    before any decision rests on the set.
    """
    label = f"eval set {eval_set.name}@v{eval_set.version} ({eval_set.id})"
    if eval_set.content_hash is None or eval_set.frozen_at is None:
        return f"{label} is not frozen; gates use frozen eval sets only"
    items = store.eval_set_tasks(session=session, eval_set_id=eval_set.id)
    recomputed = _content_hash(eval_set.name, eval_set.version, items)
    if recomputed != eval_set.content_hash:
        return (f"{label} no longer matches its frozen content hash: stored "
                f"{eval_set.content_hash[:12]}, recomputed {recomputed[:12]} from its "
                f"{len(items)} items; its items or their tasks changed after it was frozen, so "
                "no gate may use it (freeze a new version)")
    return None


def _admitted_tasks(session: Session, task_ids: Sequence[str]) -> list[Task]:
    if not task_ids:
        raise EvalSetError("an eval set needs at least one task")
    duplicates = sorted({t for t in task_ids if list(task_ids).count(t) > 1})
    if duplicates:
        raise EvalSetError(f"tasks listed more than once: {duplicates}")
    tasks = []
    for task_id in task_ids:
        task = session.get(Task, task_id)
        if task is None:
            raise EvalSetError(f"task {task_id} does not exist")
        if task.status != TaskStatus.admitted:
            raise EvalSetError(f"task {task_id} is {task.status}; only admitted tasks may be "
                               "used for evaluation")
        version = session.get(EnvironmentVersion, task.environment_version_id)
        if version is not None and version.retired_at is not None:
            raise EvalSetError(f"task {task_id} is on retired environment version {version.id}")
        tasks.append(task)
    return tasks


def create_eval_set(
    *, engine: Engine, authorizer: Authorizer, name: str, task_ids: Sequence[str],
    requested_by: str, roles: Sequence[str] = (), freeze: bool = True,
) -> EvalSetVersion:
    """Create the next version of an eval set from admitted tasks, frozen unless told not."""
    with session_scope(engine) as session:
        _admitted_tasks(session, task_ids)
    context = requested_by_context(requested_by, roles)
    for action, resource in eval_set_resources(name, freeze=freeze):
        authorizer.authorize(GOVERNANCE, action, resource, context=context)
    return store_eval_set(engine=engine, name=name, task_ids=task_ids,
                          requested_by=requested_by, freeze=freeze)


def eval_set_resources(name: str, *, freeze: bool = True) -> list[tuple[str, Resource]]:
    """(action, resource) pairs a new eval set version needs the policy to allow."""
    pairs = [("create", Resource("eval_set", attrs={"name": name})),
             ("create", Resource("eval_item", attrs={"name": name}))]
    if freeze:
        pairs.append(("freeze", Resource("eval_set", attrs={"name": name})))
    return pairs


def store_eval_set(
    *, engine: Engine, name: str, task_ids: Sequence[str], requested_by: str,
    freeze: bool = True, row_id: str | None = None, decision_id: str | None = None,
) -> EvalSetVersion:
    """Write the next eval set version (the caller authorized it).

    ``row_id`` fixes the new row's id so that a retried activity finds what it wrote.
    """
    with session_scope(engine) as session:
        done = session.get(EvalSet, row_id) if row_id else None
        if done is not None:
            return EvalSetVersion(done.id, done.name, done.version, done.content_hash,
                                  [t for t, _, _ in store.eval_set_tasks(
                                      session=session, eval_set_id=done.id)])
        tasks = _admitted_tasks(session, task_ids)
        version = store.next_version(session=session, table=EvalSet, name=name)
        eval_set = EvalSet(name=name, version=version, created_by=requested_by)
        if row_id:
            eval_set.id = row_id
        session.add(eval_set)
        session.flush()
        for ordinal, task in enumerate(tasks):
            session.add(EvalItem(eval_set_id=eval_set.id, ordinal=ordinal, task_id=task.id))
        session.flush()
        if freeze:
            _freeze(session, eval_set, tasks)
        payload: dict[str, Any] = {"name": name, "version": version,
                                   "content_hash": eval_set.content_hash,
                                   "requested_by": requested_by}
        if decision_id:
            payload["human_decision_id"] = decision_id
        _record(session, "create_eval_set", "eval_set", eval_set.id, payload)
        return EvalSetVersion(eval_set.id, name, version, eval_set.content_hash,
                              [t.id for t in tasks])


def freeze_eval_set(
    *, engine: Engine, authorizer: Authorizer, eval_set_id: str, requested_by: str,
    roles: Sequence[str] = (),
) -> EvalSetVersion:
    """Freeze an open eval set version: its hash is stored and it never changes again."""
    authorizer.authorize(GOVERNANCE, "freeze", Resource("eval_set", id=eval_set_id),
                         context=requested_by_context(requested_by, roles))
    with session_scope(engine) as session:
        eval_set = session.get(EvalSet, eval_set_id)
        if eval_set is None:
            raise EvalSetError(f"eval set {eval_set_id} does not exist")
        task_ids = [t for t, _, _ in store.eval_set_tasks(session=session,
                                                         eval_set_id=eval_set_id)]
        tasks = _admitted_tasks(session, task_ids)
        if eval_set.frozen_at is None:
            _freeze(session, eval_set, tasks)
            _record(session, "freeze_eval_set", "eval_set", eval_set.id,
                    {"content_hash": eval_set.content_hash, "requested_by": requested_by})
        return EvalSetVersion(eval_set.id, eval_set.name, eval_set.version,
                              eval_set.content_hash, task_ids)


def _freeze(session: Session, eval_set: EvalSet, tasks: Sequence[Task]) -> None:
    try:  # held out by construction: no run has trained, or may train, on these tasks
        held_out.require_held_out(
            session=session, training=held_out.training_tasks(session),
            evaluation=[t.id for t in tasks], what=f"eval set {eval_set.name}")
    except held_out.HeldOutViolation as violation:
        raise EvalSetError(str(violation)) from violation
    eval_set.content_hash = eval_set_content_hash(eval_set.name, eval_set.version, tasks)
    eval_set.frozen_at = utcnow()
    session.add(eval_set)
    session.flush()


def set_threshold(
    *, engine: Engine, authorizer: Authorizer, name: str, spec: Mapping[str, Any],
    eval_set: str | None, requested_by: str, roles: Sequence[str] = (),
    eval_sets: Mapping[str, Sequence[str]] | None = None,
) -> ThresholdVersion:
    """Store the next version of a threshold: a default frozen eval set (by id or name)
    and/or the eval sets per environment (``eval_sets``)."""
    eval_set_id, per_environment = resolve_threshold_eval_sets(
        engine=engine, eval_set=eval_set, eval_sets=eval_sets)
    authorizer.authorize(GOVERNANCE, "create", Resource("threshold", attrs={"name": name}),
                         context=requested_by_context(requested_by, roles))
    return store_threshold(engine=engine, name=name, spec=spec, eval_set_id=eval_set_id,
                           requested_by=requested_by, eval_sets=per_environment)


def resolve_threshold_eval_sets(
    *, engine: Engine, eval_set: str | None, eval_sets: Mapping[str, Sequence[str]] | None,
) -> tuple[str | None, dict[str, list[str]] | None]:
    """The default eval set's id and the per-environment map, every set frozen and checked.

    A key is an environment name or an environment version's id; each eval set it names
    must hold only tasks of that environment (or that version), so a threshold cannot
    judge one environment's candidates on another's tasks. ``EvalSetError`` names the
    problem.
    """
    if eval_set is None and not eval_sets:
        raise EvalSetError("a threshold names a default eval set, or eval sets per environment")
    default = frozen_eval_set_id(engine=engine, eval_set=eval_set) if eval_set else None
    if not eval_sets:
        return default, None
    resolved: dict[str, list[str]] = {}
    with session_scope(engine) as session:
        for key, names in sorted(eval_sets.items()):
            if not names:
                raise EvalSetError(f"eval_sets[{key!r}] names no eval set")
            version = session.get(EnvironmentVersion, key)
            known = version is not None or store.latest_environment_version(
                session=session, name=key) is not None
            if not known:
                raise EvalSetError(f"eval_sets[{key!r}]: no environment or environment version"
                                   f" {key!r}")
            ids: list[str] = []
            for name in names:
                eval_set_id = frozen_eval_set_id(engine=engine, eval_set=name)
                for task_id, _, version_id in store.eval_set_tasks(session=session,
                                                                   eval_set_id=eval_set_id):
                    holder = session.get(EnvironmentVersion, version_id)
                    env = holder.environment_name if holder else "?"
                    if (version is not None and version_id != key) or (
                            version is None and env != key):
                        raise EvalSetError(
                            f"eval set {name!r} holds task {task_id} of {env} (version"
                            f" {version_id}), not of {key!r}: an environment's eval sets hold"
                            " its own tasks")
                if eval_set_id not in ids:
                    ids.append(eval_set_id)
            resolved[key] = ids
    return default, resolved


@dataclass(frozen=True)
class CandidateEvalSets:
    """The eval sets a candidate is judged on, and why each (or the problem)."""

    eval_set_ids: list[str]  # each once, in the order first needed
    by_environment: dict[str, list[str]]  # environment trained on -> the sets judging it
    problem: str | None = None


def candidate_eval_sets(
    *, session: Session, threshold: Threshold, run_id: str | None
) -> CandidateEvalSets:
    """The eval sets of the environments the run trained on (its tasks' environments).

    For each environment version trained on: the sets the threshold names for that version,
    else for its environment's name, else the threshold's default eval set. A candidate
    trained on two environments is judged on both environments' sets and must pass every
    one. An environment with none is a problem naming it (never judged on another's set).
    """
    per_environment = threshold.eval_sets or {}
    trained = held_out.training_tasks(session, run_id=run_id) if run_id else []
    versions: dict[str, str] = {}  # version id -> environment name, of the tasks trained on
    for task_id in trained:
        task = session.get(Task, task_id)
        if task is not None and task.environment_version_id not in versions:
            holder = session.get(EnvironmentVersion, task.environment_version_id)
            versions[task.environment_version_id] = holder.environment_name if holder else "?"
    if not versions:  # nothing known about what it trained on: the default set alone
        default = [threshold.eval_set_id] if threshold.eval_set_id else []
        return CandidateEvalSets(default, {}, None if default else (
            f"threshold {threshold.name} v{threshold.version} has no default eval set, and"
            f" run {run_id} names no tasks to pick its environments' sets by"))
    chosen: list[str] = []
    by_environment: dict[str, list[str]] = {}
    missing: list[str] = []
    for version_id, environment in sorted(versions.items(), key=lambda v: (v[1], v[0])):
        sets = (per_environment.get(version_id) or per_environment.get(environment)
                or ([threshold.eval_set_id] if threshold.eval_set_id else []))
        if not sets:
            missing.append(f"{environment} (version {version_id})")
            continue
        by_environment.setdefault(environment, [])
        for eval_set_id in sets:
            if eval_set_id not in by_environment[environment]:
                by_environment[environment].append(eval_set_id)
            if eval_set_id not in chosen:
                chosen.append(eval_set_id)
    if missing:
        return CandidateEvalSets(chosen, by_environment, (
            f"threshold {threshold.name} v{threshold.version} names no eval set for "
            f"{', '.join(missing)}, which the candidate was trained on, and has no default:"
            " set one with `triloop governance threshold set --eval-set-for ENV=SET`"))
    return CandidateEvalSets(chosen, by_environment)


def frozen_eval_set_id(*, engine: Engine, eval_set: str) -> str:
    """The id of a frozen eval set named by id, or the newest version of a name."""
    with session_scope(engine) as session:
        target = session.get(EvalSet, eval_set) or store.latest_eval_set(session=session,
                                                                          name=eval_set)
        if target is None or target.frozen_at is None:
            raise EvalSetError(f"no frozen eval set {eval_set!r}: thresholds apply to frozen "
                               "sets only")
        return target.id


def store_threshold(
    *, engine: Engine, name: str, spec: Mapping[str, Any], eval_set_id: str | None,
    requested_by: str, row_id: str | None = None, decision_id: str | None = None,
    eval_sets: Mapping[str, Sequence[str]] | None = None,
) -> ThresholdVersion:
    """Write the next threshold version (the caller authorized it); ``row_id`` as above."""
    with session_scope(engine) as session:
        done = session.get(Threshold, row_id) if row_id else None
        if done is not None:
            return ThresholdVersion(done.id, done.name, done.version, done.eval_set_id,
                                    dict(done.spec), done.eval_sets)
        version = store.next_version(session=session, table=Threshold, name=name)
        # The version label is ours to give: it must name exactly this stored row.
        parsed = ThresholdSpec.from_mapping({**spec, "version": f"{name}@v{version}"})
        per_environment = ({k: list(v) for k, v in eval_sets.items()} if eval_sets else None)
        row = Threshold(name=name, version=version, eval_set_id=eval_set_id,
                        eval_sets=per_environment, spec=parsed.to_dict(),
                        created_by=requested_by)
        if row_id:
            row.id = row_id
        session.add(row)
        session.flush()
        payload: dict[str, Any] = {"name": name, "version": version,
                                   "eval_set_id": eval_set_id, "eval_sets": per_environment,
                                   "requested_by": requested_by}
        if decision_id:
            payload["human_decision_id"] = decision_id
        _record(session, "set_threshold", "threshold", row.id, payload)
        return ThresholdVersion(row.id, name, version, eval_set_id, dict(row.spec),
                                per_environment)


def _record(session: Session, action: str, kind: str, row_id: str,
            payload: Mapping[str, Any]) -> None:
    append_event(session, actor=GOVERNANCE.to_input(), action=action,
                 resource={"kind": kind, "id": row_id}, decision="record", payload=payload)
