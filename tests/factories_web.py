"""Set-up for the web tests: people with tokens, seeded promotions, and the app under test.

Rows are inserted as the owner (set-up only, as in ``tests/factories.py``); the
code under test always runs as ``triloop_web`` against the real OPA and Temporal.
The fixtures live in ``tests/factories_web_fixtures.py`` (a pytest plugin the
web test modules name in ``pytest_plugins``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
from sqlalchemy import Engine, text

from tests.factories import insert, make_checkpoint, make_eval_set, make_run, make_task, uid
from web.auth import hash_token, new_token


@dataclass(frozen=True)
class Person:
    """A seeded user and their bearer token."""

    name: str
    token: str

    @property
    def headers(self) -> dict[str, str]:
        """Authorization header for the API."""
        return {"Authorization": f"Bearer {self.token}"}


def make_user(engine: Engine, *roles: str, name: str | None = None) -> Person:
    """A user with these roles and a fresh token (valid for a day)."""
    person = Person(name or uid("u").lower(), new_token())
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO app_user (name, roles, created_by, disabled) "
                 "VALUES (:n, :r, 'test', false)"),
            {"n": person.name, "r": list(roles)},
        )
    add_token(engine, person.name, person.token)
    return person


def add_token(
    engine: Engine, user: str, token: str, *, expires_in: str = "1 day",
    revoked_by: str | None = None,
) -> str:
    """Store a token for a user, expiring after a PostgreSQL interval (negative: expired)."""
    token_id = uid("tok-")
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO api_token (id, user_name, token_hash, created_by, expires_at, "
                 "revoked_at, revoked_by) VALUES (:i, :u, :h, 'test', "
                 "now() + CAST(:e AS interval), CASE WHEN :revoked THEN now() END, :r)"),
            {"i": token_id, "u": user, "h": hash_token(token), "e": expires_in,
             "revoked": revoked_by is not None, "r": revoked_by},
        )
    return token_id


@dataclass(frozen=True)
class SeededPromotion:
    """A candidate with its parent chain, run, proposal and promotion."""

    promotion_id: str
    checkpoint_id: str
    parent_id: str
    root_id: str
    run_id: str
    workflow_id: str
    env_version_id: str


def make_promotion(
    engine: Engine, *, submitted_by: str, status: str = "open",
    current_gate: str | None = "approval", with_workflow: bool = True,
) -> SeededPromotion:
    """base checkpoint -> parent -> candidate, a run, a proposal and an open promotion."""
    task_id = make_task(engine)
    with engine.begin() as conn:
        env_version = conn.execute(text("SELECT environment_version_id FROM task WHERE id=:t"),
                                   {"t": task_id}).scalar_one()
    run_id = make_run(engine, submitted_by=submitted_by)
    root = make_checkpoint(engine, id=uid("sha-root-"), environment_version_ids=[env_version])
    parent = make_checkpoint(engine, id=uid("sha-par-"), parent_id=root, run_id=run_id,
                             iteration=5, environment_version_ids=[env_version],
                             data={"trajectories": 320, "tasks": [task_id]})
    candidate = make_checkpoint(engine, id=uid("sha-cand-"), parent_id=parent, run_id=run_id,
                                iteration=10, environment_version_ids=[env_version],
                                data={"trajectories": 640})
    proposal = uid("prop-")
    insert(engine, "proposal", id=proposal, checkpoint_id=candidate, run_id=run_id,
           submitted_by=submitted_by, evidence={"reward_mean": 0.7})
    promotion = uid("promo-")
    workflow_id = f"promotion-{proposal}"
    insert(engine, "promotion", id=promotion, proposal_id=proposal, checkpoint_id=candidate,
           run_id=run_id, submitted_by=submitted_by, status=status, current_gate=current_gate,
           workflow_id=workflow_id if with_workflow else None)
    return SeededPromotion(promotion, candidate, parent, root, run_id, workflow_id, env_version)


def add_gate(
    engine: Engine, promotion_id: str, gate: str, *, passed: bool = True,
    evidence: dict[str, Any] | None = None, with_threshold: bool = False,
    reasons: list[str] | None = None,
) -> str:
    """A gate result, optionally with a frozen eval set and a threshold (and the gate's own
    reasons, for a result taken from a real gate decision)."""
    eval_set_id = threshold_id = None
    if with_threshold:
        eval_set_id = make_eval_set(engine, frozen=True)
        threshold_id = uid("thr-")
        insert(engine, "threshold", id=threshold_id, name=threshold_id, version=1,
               eval_set_id=eval_set_id, created_by="gov",
               spec={"min_success_rate": 0.6, "min_samples": 50})
    result_id = uid("gate-")
    insert(engine, "gate_result", id=result_id, promotion_id=promotion_id, gate=gate,
           passed=passed,
           reasons=reasons or [f"{gate} {'passed' if passed else 'failed'}"],
           evidence=evidence or {"episodes": 64, "success_rate": 0.75},
           threshold_id=threshold_id, eval_set_id=eval_set_id)
    return result_id


def add_approval(
    engine: Engine, promotion_id: str, kind: str, user: str, decision: str = "approve"
) -> None:
    """A recorded human decision (as governance would have written it)."""
    insert(engine, "approval", id=uid("appr-"), promotion_id=promotion_id, kind=kind,
           decision=decision, user_name=user, comment="looked at the evidence")


def make_deployment(engine: Engine, alias: str, checkpoint_id: str, target: str | None) -> None:
    """An alias naming a checkpoint, with a rollback target, and the history behind them
    (the target bootstrapped, then the checkpoint promoted) as governance writes it."""
    insert(engine, "deployment", alias=alias, checkpoint_id=checkpoint_id,
           rollback_target_id=target, updated_by="governance")
    if target is not None:
        insert(engine, "deployment_history", alias=alias, checkpoint_id=target,
               kind="bootstrap", reason="bootstrap production", actor="gov-admin")
    insert(engine, "deployment_history", alias=alias, checkpoint_id=checkpoint_id,
           previous_checkpoint_id=target, kind="promote",
           reason="promotion p approved by olga", actor="governance")


def add_steps(engine: Engine, run_id: str, n: int, alarm_at: int | None = None) -> None:
    """n iterations of plausible metrics; one alarm at ``alarm_at``."""
    for i in range(n):
        alarms = ["echo_trap"] if i == alarm_at else []
        insert(engine, "training_step", run_id=run_id, iteration=i, loss=1.0 - i * 0.05,
               kl=0.01 * i, entropy=2.0 - i * 0.1, reward_mean=0.2 + i * 0.05,
               grad_norm=0.5 + (i % 3) * 0.1, discrimination=0.9 - i * 0.01,
               alarms=alarms, length_stats={}, metrics={})


def admitted_task(engine: Engine) -> str:
    """An admitted task id."""
    return make_task(engine, status="admitted")


def assert_problem(response: httpx.Response, status: int, *needles: str) -> dict[str, Any]:
    """The response is a problem document with this status mentioning every needle."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert body["status"] == status and body["title"] and body["type"]
    text_all = (body["detail"] + " " + " ".join(body.get("reasons") or [])).lower()
    for needle in needles:
        assert needle.lower() in text_all, body
    return body


def ensure_production(engine: Engine, people: dict[str, Person]) -> tuple[str, str | None]:
    """(checkpoint, promotion) of the production alias, promoting a seeded one if none."""
    with engine.connect() as conn:
        row = conn.execute(text(
            "SELECT checkpoint_id, promotion_id FROM deployment WHERE alias = 'production'"
        )).one_or_none()
    if row is not None:
        return str(row[0]), row[1]
    seeded = make_promotion(engine, submitted_by=people["engineer"].name, status="promoted",
                            current_gate="watch")
    make_deployment(engine, "production", seeded.checkpoint_id, seeded.parent_id)
    add_approval(engine, seeded.promotion_id, "operator", people["operator2"].name)
    with engine.begin() as conn:
        conn.execute(text("UPDATE deployment SET promotion_id = :p WHERE alias = 'production'"),
                     {"p": seeded.promotion_id})
    return seeded.checkpoint_id, seeded.promotion_id


def console_cookie(app: Any, person: Person, csrf: str = "c") -> str:
    """A console session cookie as ``POST /login`` makes it: the database opens the session
    from the person's token (``triloop_sign_in``), the app signs its secret into the cookie."""
    from triloop.db import session_scope
    from web import tokens
    from web.auth import ConsoleSession

    services = app.state.services
    with session_scope(services.engine) as session:
        opened = tokens.sign_in(session=session, token=person.token, lifetime_s=3600)
    return str(services.signer.dump_session(ConsoleSession(
        user=opened.user_name, csrf=csrf, token_id=opened.token_id, secret=opened.secret)))
