"""Each role's GRANTs mirror the policy: allowed writes succeed, forbidden ones fail."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError, ProgrammingError

from tests.factories import (
    insert,
    make_checkpoint,
    make_environment_version,
    make_eval_set,
    make_run,
    make_task,
    uid,
)

pytestmark = pytest.mark.integration


def _run(engine: Engine, sql: str, params: dict[str, Any] | None = None) -> None:
    with engine.begin() as conn:
        conn.execute(text(sql), params or {})


def _refused(engine: Engine, sql: str, params: dict[str, Any] | None = None) -> str:
    with pytest.raises((ProgrammingError, DBAPIError)) as caught:
        _run(engine, sql, params)
    message = str(caught.value.orig)
    assert "permission denied" in message or "frozen" in message or "append-only" in message
    return message


FORBIDDEN_FOR_LEARNING = [
    # Which tasks are held out (a task set's eval and traffic splits) is not learning's to read.
    "SELECT * FROM task_set_member",
    "SELECT * FROM task_set",
    "INSERT INTO eval_set (id, name, version, created_by) VALUES ('x', 'x', 1, 'learning')",
    "INSERT INTO eval_item (eval_set_id, ordinal, task_id) VALUES ('x', 0, 'x')",
    "INSERT INTO threshold (id, name, version, spec, created_by) VALUES "
    "('x', 'x', 1, '{}', 'learning')",
    "UPDATE threshold SET spec = '{}'",
    "DELETE FROM eval_item",
    "INSERT INTO promotion (id, proposal_id, checkpoint_id, run_id, submitted_by) VALUES "
    "('x', 'x', 'x', 'x', 'x')",
    "UPDATE promotion SET status = 'promoted'",
    "INSERT INTO approval (id, promotion_id, kind, decision, user_name, comment) VALUES "
    "('x', 'x', 'operator', 'approve', 'l', 'c')",
    "INSERT INTO deployment (alias, checkpoint_id, updated_by) VALUES ('production', 'x', 'l')",
    "UPDATE deployment SET checkpoint_id = 'x'",
    "UPDATE deployment SET rollback_target_id = 'x'",
    "INSERT INTO routing (slot, checkpoint_id, share, updated_by) VALUES ('canary', 'x', 1, 'l')",
    "UPDATE routing SET share = 1",
    "UPDATE environment_version SET contract = '{}'",
    "INSERT INTO environment_version (id, environment_name, version, contract, contract_text, "
    "fixture_hashes, created_by) VALUES ('x', 'x', 1, '{}', '', '{}', 'l')",
    "SELECT * FROM eval_item",
    "SELECT * FROM threshold",
]

FORBIDDEN_FOR_EXECUTION = [
    "UPDATE environment_version SET contract = '{}'",
    "INSERT INTO environment (name, created_by) VALUES ('x', 'e')",
    "INSERT INTO eval_set (id, name, version, created_by) VALUES ('x', 'x', 1, 'e')",
    "DELETE FROM eval_item",
    "UPDATE threshold SET spec = '{}'",
    "INSERT INTO checkpoint (id, base_model, artifact_uri, created_by) VALUES ('x','b','u','e')",
    "UPDATE routing SET share = 1",
    "UPDATE task SET status = 'admitted'",
]

FORBIDDEN_FOR_GOVERNANCE = [
    "INSERT INTO checkpoint (id, base_model, artifact_uri, created_by) VALUES ('x','b','u','g')",
    "UPDATE checkpoint SET parent_id = NULL",
    "INSERT INTO training_step (run_id, iteration) VALUES ('x', 1)",
    "INSERT INTO trajectory (id, batch_id, task_id, checkpoint_id, purpose, group_id, status, "
    "total_reward) VALUES ('x','b','t','c','eval','g','completed',0)",
    "UPDATE environment_version SET contract = '{}'",
]

FORBIDDEN_FOR_WEB = [
    "INSERT INTO approval (id, promotion_id, kind, decision, user_name, comment) VALUES "
    "('x', 'x', 'operator', 'approve', 'w', 'c')",
    "UPDATE deployment SET checkpoint_id = 'x'",
    "UPDATE routing SET share = 1",
    "INSERT INTO checkpoint (id, base_model, artifact_uri, created_by) VALUES ('x','b','u','w')",
    "UPDATE threshold SET spec = '{}'",
]


@pytest.mark.parametrize("sql", FORBIDDEN_FOR_LEARNING)
def test_learning_role_cannot_touch_what_judges_it(
    role_engine: Callable[[str], Engine], sql: str
) -> None:
    _refused(role_engine("learning"), sql)


@pytest.mark.parametrize("sql", FORBIDDEN_FOR_EXECUTION)
def test_execution_role_cannot_change_contracts_or_eval(
    role_engine: Callable[[str], Engine], sql: str
) -> None:
    _refused(role_engine("execution"), sql)


@pytest.mark.parametrize("sql", FORBIDDEN_FOR_GOVERNANCE)
def test_governance_role_never_trains(role_engine: Callable[[str], Engine], sql: str) -> None:
    _refused(role_engine("governance"), sql)


@pytest.mark.parametrize("sql", FORBIDDEN_FOR_WEB)
def test_web_role_decides_nothing_directly(role_engine: Callable[[str], Engine], sql: str) -> None:
    _refused(role_engine("web"), sql)


def test_learning_role_allowed_writes(
    role_engine: Callable[[str], Engine], owner_engine: Engine
) -> None:
    learning = role_engine("learning")
    run_id = make_run(owner_engine)
    ckpt = uuid.uuid4().hex * 2  # a checkpoint is named by the sha256 of its weights
    _run(
        learning,
        "INSERT INTO checkpoint (id, base_model, artifact_uri, created_by, run_id) "
        "VALUES (:i, 'tiny', 'file:///x', 'learning', :r)",
        {"i": ckpt, "r": run_id},
    )
    _run(learning, "INSERT INTO training_step (run_id, iteration, loss) VALUES (:r, 1, 0.5)",
         {"r": run_id})
    _run(
        learning,
        "INSERT INTO proposal (id, checkpoint_id, run_id, submitted_by) "
        "VALUES (:p, :c, :r, 'alice')",
        {"p": uid("prop-"), "c": ckpt, "r": run_id},
    )
    _run(learning, "UPDATE training_run SET status = 'running' WHERE id = :r", {"r": run_id})
    # ...but not the run's config or submitter, which the submitter owns.
    _refused(learning, "UPDATE training_run SET submitted_by = 'mallory' WHERE id = :r",
             {"r": run_id})


def test_execution_role_writes_trajectories(
    role_engine: Callable[[str], Engine], owner_engine: Engine
) -> None:
    execution = role_engine("execution")
    task_id = make_task(owner_engine)
    traj = uid("ep-")
    _run(execution, "INSERT INTO rollout_batch (id, purpose, requested_by, planned_episodes) "
         "VALUES (:b, 'training', 'learning', CAST(:plan AS jsonb))",
         {"b": (batch := uid("b-")), "plan": _plan(traj, task=task_id)})
    _run(
        execution,
        "INSERT INTO trajectory (id, batch_id, task_id, checkpoint_id, purpose, group_id, status, "
        "total_reward, sample_index, policy_version, success, num_steps) "
        "VALUES (:i, :b, :t, 'c', 'training', 'g', 'completed', 1.0, 0, 0, true, 1)",
        {"i": traj, "b": batch, "t": task_id},
    )
    _run(
        execution,
        "INSERT INTO trajectory_sequence (trajectory_id, token_ids, action_mask, "
        "behaviour_logprobs, segment_starts) VALUES (:i, '{1,2,3}', '{0,0,1}', '{-0.5}', '{0}')",
        {"i": traj},
    )
    _run(
        execution,
        "INSERT INTO step (trajectory_id, index, prompt_start, observation_start, action_start, "
        "action_end, reward, observation, action_text, done) "
        "VALUES (:i, 0, 0, 0, 2, 3, 1.0, 'o', 'a', true)",
        {"i": traj},
    )
    _refused(execution, "UPDATE trajectory SET total_reward = 9 WHERE id = :i", {"i": traj})
    _refused(execution, "UPDATE trajectory_sequence SET token_ids = '{9}' WHERE trajectory_id = :i",
             {"i": traj})


def _denied(engine: Engine, sql: str, params: dict[str, Any] | None = None) -> str:
    """Refused with SQLSTATE 42501 (no grant, or a trigger's insufficient_privilege)."""
    with pytest.raises((ProgrammingError, DBAPIError)) as caught:
        _run(engine, sql, params)
    assert getattr(caught.value.orig, "sqlstate", None) == "42501", caught.value.orig
    return str(caught.value.orig)


TRAJECTORY = (
    "INSERT INTO trajectory (id, batch_id, task_id, checkpoint_id, purpose, group_id, status, "
    "total_reward, sample_index, policy_version, success, num_steps) "
    "VALUES (:i, :b, :t, :c, :p, 'g', 'completed', 1.0, 0, 0, true, 1)"
)
BATCH = ("INSERT INTO rollout_batch (id, purpose, checkpoint_id, requested_by, "
         "planned_episodes) VALUES (:b, :p, :c, :r, CAST(:plan AS jsonb))")


def _plan(*episodes: str, task: str = "t") -> str:
    """A ``planned_episodes`` value: these episode ids, all on one task."""
    return json.dumps({e: {"task_id": task, "seed": 0} for e in episodes})


def test_execution_stores_episodes_only_as_their_batch_was_asked_for(
    role_engine: Callable[[str], Engine], owner_engine: Engine
) -> None:
    execution = role_engine("execution")
    task_id = make_task(owner_engine)
    batch = uid("eval-")
    planned = [f"{batch}:0:{i}" for i in range(12)]
    _run(role_engine("governance"), BATCH, {"b": batch, "p": "eval", "c": "c-asked",
                                            "r": "governance",
                                            "plan": _plan(*planned, task=task_id)})
    left = iter(planned)

    def episode(**changes: str) -> dict[str, str]:
        return {"i": next(left), "b": batch, "t": task_id, "c": "c-asked", "p": "eval",
                **changes}

    never = _denied(execution, TRAJECTORY, episode(b=uid("never-")))
    assert "was never requested" in never
    assert "asked for c-asked" in _denied(execution, TRAJECTORY, episode(c="c-other"))
    assert "a training episode in eval batch" in _denied(execution, TRAJECTORY,
                                                           episode(p="training"))
    # Only the episodes the batch planned, on the planned task.
    assert "not an episode batch" in _denied(execution, TRAJECTORY, episode(i=uid("ep-")))
    assert "planned it on task" in _denied(execution, TRAJECTORY,
                                           episode(t=make_task(owner_engine)))
    _run(execution, TRAJECTORY, episode())
    # Production batches carry their shadow and canary episodes, from any checkpoint; a
    # shadow stands beside the production episode it mirrors.
    traffic = uid("traffic-")
    served = [f"{traffic}:0:{i}" for i in range(2)]
    _run(role_engine("web"), BATCH, {"b": traffic, "p": "production", "c": None, "r": "web",
                                     "plan": _plan(*served, task=task_id)})
    for episode_id, purpose, checkpoint in ((served[0], "production", "c1"),
                                            (f"{served[0]}:shadow", "shadow", "c2"),
                                            (served[1], "canary", "c3")):
        _run(execution, TRAJECTORY, episode(i=episode_id, b=traffic, p=purpose, c=checkpoint))
    assert "<planned episode>:shadow" in _denied(execution, TRAJECTORY, episode(
        i=served[1], b=traffic, p="shadow", c="c2"))


def test_each_role_vouches_only_for_the_requests_it_can_know(
    role_engine: Callable[[str], Engine]
) -> None:
    execution, web = role_engine("execution"), role_engine("web")
    governance = role_engine("governance")

    def batch(purpose: str, requested_by: str, plan: str | None = None) -> dict[str, str | None]:
        return {"b": uid("b-"), "p": purpose, "c": None, "r": requested_by,
                "plan": _plan("e") if plan is None else plan}

    # Execution vouches only for what its Nexus handler received: learning's training...
    assert "not a production batch for web" in _denied(execution, BATCH,
                                                       batch("production", "web"))
    assert "not a eval batch for learning" in _denied(execution, BATCH,
                                                      batch("eval", "learning"))
    # ...never "governance asked": governance records its own batches.
    assert "record their own" in _denied(execution, BATCH, batch("eval", "governance"))
    _run(governance, BATCH, batch("eval", "governance"))
    assert "not a training batch" in _denied(governance, BATCH, batch("training", "learning"))
    assert "not a eval batch for learning" in _denied(governance, BATCH,
                                                      batch("eval", "learning"))
    # The web service records people's production traffic and nothing else.
    assert "not a eval batch" in _denied(web, BATCH, batch("eval", "web"))
    assert "for governance" in _denied(web, BATCH, batch("production", "governance"))
    # Every batch names the episodes it plans.
    assert "planned_episodes" in _denied(web, BATCH, batch("production", "web", plan="{}"))
    # The learning loop never writes batches; nobody forges the stamp.
    _denied(role_engine("learning"), BATCH, batch("training", "learning"))
    assert "inserting role" in _denied(
        execution, BATCH.replace("planned_episodes)", "planned_episodes, recorded_by)").replace(
            "jsonb))", "jsonb), 'triloop_web')"), batch("training", "learning"))
    # Rows never change, not even for the owner's roles with a grant.
    row = batch("training", "learning")
    _run(execution, BATCH, row)
    _denied(execution, "UPDATE rollout_batch SET checkpoint_id = 'x' WHERE id = :b", row)
    _denied(execution, "DELETE FROM rollout_batch WHERE id = :b", row)


def test_governance_role_owns_gates_and_routing(
    role_engine: Callable[[str], Engine], owner_engine: Engine
) -> None:
    governance = role_engine("governance")
    ckpt = make_checkpoint(owner_engine)
    set_id = make_eval_set(owner_engine)
    task_id = make_task(owner_engine)
    _run(governance, "INSERT INTO eval_item (eval_set_id, ordinal, task_id) VALUES (:s, 0, :t)",
         {"s": set_id, "t": task_id})
    _run(governance, "UPDATE eval_set SET frozen_at = now(), content_hash = 'h' WHERE id = :s",
         {"s": set_id})
    _run(
        governance,
        # A threshold names the eval set it judges on (0029's check).
        "INSERT INTO threshold (id, name, version, spec, eval_set_id, created_by) "
        "VALUES (:i, :i, 1, :spec, :s, 'gov')",
        {"i": uid("th-"), "spec": json.dumps({"min_success_rate": 0.5}), "s": set_id},
    )
    slot = uid("slot-")
    _run(governance, "INSERT INTO routing (slot, checkpoint_id, share, updated_by) "
                     "VALUES (:s, :c, 0.1, 'gov')", {"s": slot, "c": ckpt})
    _run(governance, "UPDATE routing SET share = 0.2 WHERE slot = :s", {"s": slot})


def test_frozen_eval_set_never_changes_even_for_governance(
    role_engine: Callable[[str], Engine], owner_engine: Engine
) -> None:
    governance = role_engine("governance")
    set_id = make_eval_set(owner_engine, frozen=True)
    task_id = make_task(owner_engine)
    message = _refused(
        governance,
        "INSERT INTO eval_item (eval_set_id, ordinal, task_id) VALUES (:s, 0, :t)",
        {"s": set_id, "t": task_id},
    )
    assert "frozen" in message
    _refused(governance, "UPDATE eval_set SET content_hash = 'other' WHERE id = :s", {"s": set_id})


def test_environment_version_contract_is_immutable(
    role_engine: Callable[[str], Engine], owner_engine: Engine
) -> None:
    version_id = make_environment_version(owner_engine)
    for service in ("execution", "learning", "governance", "web"):
        _refused(role_engine(service),
                 "UPDATE environment_version SET contract = '{}' WHERE id = :v", {"v": version_id})
    _run(role_engine("governance"),
         "UPDATE environment_version SET retired_at = now(), retired_by = 'gov' WHERE id = :v",
         {"v": version_id})


def _login(url: str) -> str:
    import psycopg

    with psycopg.connect(url.replace("+psycopg", ""), connect_timeout=5) as conn:
        return str(conn.execute("SELECT current_user").fetchone()[0])  # type: ignore[index]


def test_each_role_logs_in_with_its_own_password_only(db_settings: Any) -> None:
    import psycopg
    from sqlalchemy.engine import make_url

    learning = db_settings.role_url("learning")
    assert _login(learning) == "triloop_learning"
    url = make_url(learning)
    governance_password = make_url(db_settings.role_url("governance")).password
    for password in (None, governance_password, "guess"):
        attempt = url._replace(password=password).render_as_string(hide_password=False)
        with pytest.raises(psycopg.OperationalError, match="password|no password"):
            _login(attempt)


def test_no_trust_is_left_in_pg_hba(db_settings: Any, owner_engine: Engine) -> None:
    with owner_engine.connect() as conn:
        rules = conn.execute(text(
            "SELECT type, auth_method FROM pg_hba_file_rules WHERE error IS NULL")).all()
    assert rules and {method for _, method in rules} == {"scram-sha-256"}, rules


@pytest.mark.parametrize("service", ["learning", "execution", "governance"])
def test_no_loop_role_can_read_api_token_hashes(
    role_engine: Callable[[str], Engine], owner_engine: Engine, service: str
) -> None:
    from tests.factories_web import make_user

    person = make_user(owner_engine, "operator")
    engine = role_engine(service)
    for sql in ("SELECT token_hash FROM api_token", "SELECT id, expires_at FROM api_token"):
        assert "permission denied" in _refused(engine, sql)
    # People and their roles stay readable (workers check who acts); no hash lives there.
    with engine.begin() as conn:
        row = conn.execute(text("SELECT * FROM app_user WHERE name = :n"),
                           {"n": person.name}).mappings().one()
    assert "token_hash" not in row and row["roles"] == ["operator"]


def test_web_role_may_revoke_a_token_but_never_extend_or_rekey_it(
    role_engine: Callable[[str], Engine], owner_engine: Engine
) -> None:
    from tests.factories_web import add_token, make_user

    person = make_user(owner_engine, "auditor")
    token_id = add_token(owner_engine, person.name, uid("tl_"))
    web = role_engine("web")
    for sql in ("UPDATE api_token SET expires_at = now() + interval '10 years' WHERE id = :t",
                "UPDATE api_token SET token_hash = 'forged' WHERE id = :t",
                "DELETE FROM api_token WHERE id = :t"):
        _refused(web, sql, {"t": token_id})
    _run(web, "UPDATE api_token SET revoked_at = now(), revoked_by = 'admin' WHERE id = :t",
         {"t": token_id})


def _refused_and_rolled_back(engine: Engine, sql: str, params: dict[str, Any]) -> str:
    # Every statement runs in a transaction that is rolled back: if a trigger ever let
    # it through, the shared test database would still keep its eval items.
    with engine.connect() as conn:
        transaction = conn.begin()
        try:
            with pytest.raises((ProgrammingError, DBAPIError)) as caught:
                conn.execute(text(sql), params)
        finally:
            transaction.rollback()
    return str(caught.value.orig)


def test_frozen_eval_set_cannot_be_emptied_or_left_even_by_the_owner(owner_engine: Engine) -> None:
    frozen, open_set = make_eval_set(owner_engine), make_eval_set(owner_engine)
    task_id = make_task(owner_engine)
    _run(owner_engine, "INSERT INTO eval_item (eval_set_id, ordinal, task_id) VALUES (:s, 0, :t)",
         {"s": frozen, "t": task_id})
    _run(owner_engine, "UPDATE eval_set SET frozen_at = now() WHERE id = :s", {"s": frozen})
    attempts = {
        "UPDATE eval_item SET eval_set_id = :o WHERE eval_set_id = :s": "is frozen",
        "UPDATE eval_item SET ordinal = 7 WHERE eval_set_id = :s": "is frozen",
        "DELETE FROM eval_item WHERE eval_set_id = :s": "is frozen",
        "TRUNCATE eval_item": "TRUNCATE eval_item refused",
        "TRUNCATE eval_set CASCADE": "refused: frozen eval sets never change",
    }
    for sql, needle in attempts.items():
        assert needle in _refused_and_rolled_back(owner_engine, sql, {"s": frozen, "o": open_set})
    with owner_engine.begin() as conn:
        kept = conn.execute(text("SELECT eval_set_id FROM eval_item WHERE task_id = :t"),
                            {"t": task_id}).scalars().all()
    assert kept == [frozen]
    # An open set's items still move freely.
    other = make_task(owner_engine)
    _run(owner_engine, "INSERT INTO eval_item (eval_set_id, ordinal, task_id) VALUES (:s, 0, :t)",
         {"s": open_set, "t": other})
    _run(owner_engine, "UPDATE eval_item SET ordinal = 1 WHERE eval_set_id = :s", {"s": open_set})


def test_learning_sees_training_episodes_only(
    role_engine: Callable[[str], Engine], owner_engine: Engine
) -> None:
    task_id = make_task(owner_engine)
    run_id = make_run(owner_engine)
    ids = {}
    for purpose in ("training", "eval", "shadow", "canary", "production"):
        batch = uid(f"{purpose}-")
        ids[purpose] = f"{batch}:0:0"
        insert(owner_engine, "rollout_batch", id=batch,
               purpose="production" if purpose in ("shadow", "canary") else purpose,
               requested_by={"training": "learning", "production": "web"}.get(purpose,
                                                                            "governance"),
               planned_episodes={ids[purpose]: {"task_id": task_id, "seed": 0}})
        if purpose == "shadow":
            ids[purpose] += ":shadow"
        _run(role_engine("execution"), TRAJECTORY, {
            "i": ids[purpose], "b": batch, "t": task_id, "c": "c", "p": purpose})
        _run(role_engine("execution"),
             "INSERT INTO step (trajectory_id, index, observation, action_text, reward, done) "
             "VALUES (:i, 0, 'o', 'a', 0, true)", {"i": ids[purpose]})
    with owner_engine.begin() as conn:  # a training episode belongs to a run
        conn.execute(text("UPDATE trajectory SET run_id = :r WHERE id = :i"),
                     {"r": run_id, "i": ids["training"]})

    def visible(role: str, table: str, column: str) -> set[str]:
        with role_engine(role).connect() as conn:
            return {str(r[0]) for r in conn.execute(
                text(f"SELECT {column} FROM {table} WHERE {column} = ANY(:ids)"),
                {"ids": list(ids.values())})}

    assert visible("learning", "trajectory", "id") == {ids["training"]}
    # Steps: the learning role reads the view of training steps; the table itself is refused.
    assert visible("learning", "learning_step", "trajectory_id") == {ids["training"]}
    _denied(role_engine("learning"), "SELECT count(*) FROM step")
    for role in ("execution", "governance", "web"):
        assert visible(role, "trajectory", "id") == set(ids.values())
        assert visible(role, "step", "trajectory_id") == set(ids.values())


def test_learning_names_checkpoints_by_digest_only(
    role_engine: Callable[[str], Engine]
) -> None:
    learning = role_engine("learning")
    sql = ("INSERT INTO checkpoint (id, base_model, environment_version_ids, data, artifact_uri, "
           "created_by) VALUES (:i, :i, '{}', '{}', :u, 'learning')")
    digest = uuid.uuid4().hex * 2
    assert "is not the sha256 of its weights" in _denied(
        learning, sql, {"i": "my-favourite-checkpoint", "u": "file:///tmp/x"})
    assert "is not a file:// or s3:// URI" in _denied(
        learning, sql, {"i": digest, "u": "http://attacker.example/weights"})
    _run(learning, sql, {"i": digest, "u": f"file:///artifacts/{digest}"})
