"""Rows for tests, inserted as the owner (set-up only) with unique ids."""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

_WEIGHTS_ROOT = Path(tempfile.gettempdir()) / f"triloop-test-weights-{os.getpid()}"


def uid(prefix: str = "") -> str:
    """A unique id for test rows."""
    return f"{prefix}{uuid.uuid4().hex[:12]}"


def insert(engine: Engine, table: str, **values: Any) -> dict[str, Any]:
    """INSERT one row as the owner; returns the values."""
    import json

    columns = ", ".join(values)
    params = {k: json.dumps(v) if isinstance(v, dict) else v for k, v in values.items()}
    placeholders = ", ".join(f":{k}" for k in values)
    with engine.begin() as conn:
        conn.execute(text(f"INSERT INTO {table} ({columns}) VALUES ({placeholders})"), params)
    return values


def make_weights_dir(root: Path | None = None) -> tuple[Path, str]:
    """A directory holding one small, unique safetensors file: (directory, its checkpoint id)."""
    import numpy as np
    from safetensors.numpy import save_file

    from triloop.weights import safetensors_digest

    directory = (root or _WEIGHTS_ROOT) / uid("w-")
    directory.mkdir(parents=True)
    save_file({"w": np.frombuffer(uuid.uuid4().bytes, dtype=np.uint8).copy()},
              str(directory / "model.safetensors"))
    return directory, safetensors_digest(directory)


def make_checkpoint(engine: Engine, **overrides: Any) -> str:
    """A checkpoint row; returns its id.

    Unless the caller names the id or the artifact, the row points at real (tiny)
    weights whose sha256 is its id, as the learning loop registers them: governance
    verifies them before production moves.
    """
    values: dict[str, Any] = {
        "id": uid("ckpt-"),
        "base_model": "tiny",
        "artifact_uri": "file:///nowhere",
        "created_by": "learning",
        "data": {},
    }
    if "id" not in overrides and "artifact_uri" not in overrides:
        directory, values["id"] = make_weights_dir()
        values["artifact_uri"] = directory.as_uri()
    values.update(overrides)
    insert(engine, "checkpoint", **values)
    return str(values["id"])


def make_environment_version(engine: Engine) -> str:
    """An environment with one version; returns the version id."""
    name = uid("env-")
    insert(engine, "environment", name=name, description="", created_by="test")
    version_id = uid("sha-")
    insert(
        engine,
        "environment_version",
        id=version_id,
        environment_name=name,
        version=1,
        contract={"task": name},
        contract_text="task: x",
        fixture_hashes={},
        created_by="test",
    )
    return version_id


def make_task(engine: Engine, status: str = "admitted") -> str:
    """A task on a fresh environment version; returns its id."""
    task_id = uid("task-")
    insert(
        engine,
        "task",
        id=task_id,
        environment_version_id=make_environment_version(engine),
        seed=1,
        status=status,
        evidence={},
    )
    return task_id


def make_run(engine: Engine, submitted_by: str = "alice") -> str:
    """A training run; returns its id."""
    run_id = uid("run-")
    insert(
        engine, "training_run", id=run_id, submitted_by=submitted_by, config={}, name="t",
        status="submitted", iterations_done=0,
    )
    return run_id


def make_eval_set(engine: Engine, *, frozen: bool = False) -> str:
    """An eval set (optionally frozen); returns its id."""
    set_id = uid("es-")
    insert(engine, "eval_set", id=set_id, name=set_id, version=1, created_by="gov")
    if frozen:
        with engine.begin() as conn:
            conn.execute(text("UPDATE eval_set SET frozen_at = now() WHERE id = :i"), {"i": set_id})
    return set_id


def make_person(engine: Engine, name: str, roles: list[str], *, disabled: bool = False) -> str:
    """A person in ``app_user`` with exactly these roles now (inserted or updated as owner).

    A new person is created a day ago: they hold their roles since before any promotion a
    test opens (issue 19 item 2 refuses a role newer than the promotion it decides on).
    """
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO app_user (name, roles, created_by, disabled, created_at) "
            "VALUES (:n, :r, 'test', :d, now() - interval '1 day') "
            "ON CONFLICT (name) DO UPDATE"
            " SET roles = EXCLUDED.roles, disabled = EXCLUDED.disabled"),
            {"n": name, "r": roles, "d": disabled})
    return name


def person_token(owner: Engine, user: str) -> str:
    """A fresh, live API token of ``user``, issued as the owner (as ``triloop users token``)."""
    import hashlib

    token = f"tl_{uuid.uuid4().hex}{uuid.uuid4().hex}"
    with owner.begin() as conn:
        conn.execute(text(
            "INSERT INTO api_token (id, user_name, token_hash, label, created_by, expires_at)"
            " VALUES (:i, :u, :h, 'test', 'test', now() + interval '1 day')"),
            {"i": uid("tok-"), "u": user, "h": hashlib.sha256(token.encode()).hexdigest()})
    return token


def record_decision(engine: Engine, *, kind: str, subject: str, decision: str, user: str,
                    comment: str = "checked the evidence", details: dict[str, Any] | None = None,
                    owner: Engine | None = None, credential: str | None = None) -> str:
    """A person's decision.

    With ``owner`` or ``credential``: as the web service records it, ``engine`` (the web
    role) calling ``triloop_record_decision`` with the person's token (``credential``, or a
    fresh one issued as ``owner``). Without: a row inserted directly with ``engine``'s role
    (the owner, or a forger the database refuses).
    """
    if owner is None and credential is None:
        decision_id = uid("dec-")
        insert(engine, "human_decision", id=decision_id, kind=kind, subject=subject,
               decision=decision, user_name=user, comment=comment, details=details or {})
        return decision_id
    import json

    if credential is None:
        assert owner is not None
        credential = person_token(owner, user)
    with engine.begin() as conn:
        return str(conn.execute(text(
            "SELECT triloop_record_decision(:c, :k, :s, :d, :m, CAST(:x AS jsonb))"),
            {"c": credential, "k": kind, "s": subject, "d": decision, "m": comment,
             "x": json.dumps(details or {})}).scalar_one())


def outcome_advantages(returns: Any, config: Any) -> Any:
    """``compute_turn_advantages`` under ``outcome`` credit, one turn per trajectory return."""
    from learning_loop.advantages import TrajectoryTurns, compute_turn_advantages

    turns = [TrajectoryTurns(r.trajectory_id, r.group_id, r.task_id, (r.total_reward,),
                             r.environment) for r in returns]
    return compute_turn_advantages(turns, config.model_copy(update={"credit": "outcome"}))
