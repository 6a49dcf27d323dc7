"""Checkpoint retention against the real PostgreSQL (and OPA, Temporal for the run).

The database decides what may lose its weights (``triloop_prune_checkpoints``, migration
0026): what serves or may serve production, candidates, rollback targets, bases and the
run's last K iterations survive; the rest keep their rows, marked. Whoever then asks for
pruned weights gets an error naming the rule.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError, ProgrammingError
from sqlmodel import Session
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from execution_loop.serving import PolicyCache
from governance_loop.activities.rollback import _pruned_problem
from learning_loop.activities.bases import BaseActivities
from learning_loop.activities.update import UpdateActivities
from learning_loop.contracts import CHECKPOINT_PRUNED, RegisterBaseInput, UpdateInput
from learning_loop.retention import CheckpointFiles, prune_run
from learning_loop.store import prune_checkpoints
from tests.factories import insert, make_checkpoint, uid
from tests.factories_learning import (
    frozen_lake_tasks,
    loops_running,
    make_user,
    queue_settings,
    rows,
    run_config,
    start_run,
)
from tests.factories_learning import make_run as make_configured_run
from triloop.config import ServiceName, Settings
from triloop.retention import CheckpointPruned
from triloop.run_config import run_config_from_data
from triloop.wiring import build_authorizer

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_learning_fixtures"]

RoleEngine = Callable[[ServiceName], Engine]


def make_run(owner: Engine, keep_last: int | None = None) -> str:
    """A run row whose RUN.yaml says ``checkpoints.keep_last`` (or nothing)."""
    run_id = uid("run-")
    config = {"checkpoints": {"keep_last": keep_last}} if keep_last is not None else {}
    insert(owner, "training_run", id=run_id, submitted_by="alice", config=config, name="r",
           status="running", iterations_done=0)
    return run_id


def make_chain(owner: Engine, run_id: str, base: str, n: int) -> list[str]:
    """n iterations of a run: checkpoints c1..cn (parent chain from ``base``) and steps."""
    chain, parent = [], base
    for iteration in range(1, n + 1):
        checkpoint = make_checkpoint(owner, parent_id=parent, run_id=run_id, base_model=base,
                                     iteration=iteration)
        insert(owner, "training_step", run_id=run_id, iteration=iteration,
               checkpoint_id=checkpoint, length_stats={}, metrics={})
        chain.append(checkpoint)
        parent = checkpoint
    return chain


def protected_scene(owner: Engine) -> dict[str, Any]:
    """A run of 8 iterations whose checkpoints are protected in every way but two."""
    run_id = make_run(owner)
    base = make_checkpoint(owner)
    c = make_chain(owner, run_id, base, 8)
    proposal = uid("prop-")
    insert(owner, "proposal", id=proposal, checkpoint_id=c[1], run_id=run_id,
           submitted_by="alice", evidence={})  # c2: a proposed candidate
    insert(owner, "promotion", id=uid("promo-"), proposal_id=proposal, checkpoint_id=c[1],
           run_id=run_id, submitted_by="alice", status="open",
           baseline_checkpoint_id=c[5])  # c6: the open promotion's baseline
    alias = uid("alias-")  # an alias of the test's own: production is the session's
    insert(owner, "deployment", alias=alias, checkpoint_id=c[2], updated_by="governance")
    insert(owner, "deployment_history", alias=alias, checkpoint_id=c[3], kind="bootstrap",
           reason="bootstrap", actor="ops")  # c4: an earlier revision, a rollback target
    insert(owner, "deployment_history", alias=alias, checkpoint_id=c[2],
           previous_checkpoint_id=c[3], kind="promote", reason="p", actor="governance")
    return {"run_id": run_id, "base": base, "c": c}


def marks(owner: Engine, ids: list[str]) -> dict[str, tuple[bool, str | None]]:
    found = rows(owner, "SELECT id, pruned_at IS NOT NULL AS pruned, pruned_rule FROM checkpoint"
                 " WHERE id = ANY(:ids)", ids=ids)
    return {r["id"]: (r["pruned"], r["pruned_rule"]) for r in found}


def test_protected_checkpoints_survive_and_the_rest_is_marked(
    owner_engine: Engine, role_engine: RoleEngine
) -> None:
    scene = protected_scene(owner_engine)
    run_id, c = scene["run_id"], scene["c"]
    learning = role_engine("learning")

    dry = prune_checkpoints(engine=learning, run_id=run_id, keep_last=2, retain=[c[4]],
                            dry_run=True)
    assert [p.checkpoint_id for p in dry] == [c[0]]  # c5 retained by the caller
    assert not any(pruned for pruned, _ in marks(owner_engine, c).values())  # nothing marked

    pruned = prune_checkpoints(engine=learning, run_id=run_id, keep_last=2)
    assert [(p.checkpoint_id, p.newly) for p in pruned] == [(c[0], True), (c[4], True)]
    rule = f"keep_last=2 of run {run_id}"
    assert marks(owner_engine, c) == {
        c[0]: (True, rule), c[1]: (False, None), c[2]: (False, None), c[3]: (False, None),
        c[4]: (True, rule), c[5]: (False, None), c[6]: (False, None), c[7]: (False, None)}
    # The rows stay whole: lineage and digests are untouched.
    kept = rows(owner_engine, "SELECT id, parent_id, iteration FROM checkpoint WHERE id = :i",
                i=c[4])
    assert kept == [{"id": c[4], "parent_id": c[3], "iteration": 5}]
    assert marks(owner_engine, [scene["base"]]) == {scene["base"]: (False, None)}
    # Again: nothing new, both listed (so files a crash left behind are deleted next time).
    again = prune_checkpoints(engine=learning, run_id=run_id, keep_last=2)
    assert [(p.checkpoint_id, p.newly) for p in again] == [(c[0], False), (c[4], False)]


def test_the_function_is_learnings_alone_and_bounded_by_the_runs_own_rule(
    owner_engine: Engine, role_engine: RoleEngine
) -> None:
    keeps_five = make_run(owner_engine, keep_last=5)
    base = make_checkpoint(owner_engine)
    own = make_chain(owner_engine, keeps_five, base, 7)
    other = make_run(owner_engine)
    others = make_chain(owner_engine, other, base, 4)
    learning = role_engine("learning")

    # A caller's keep_last=1 cannot prune harder than the run's RUN.yaml (5) asked for,
    pruned = prune_checkpoints(engine=learning, run_id=keeps_five, keep_last=1)
    assert [p.checkpoint_id for p in pruned] == own[:2]
    assert {p.rule for p in pruned} == {f"keep_last=5 of run {keeps_five}"}
    # and pruning one run never touches another's checkpoints.
    assert not any(flag for flag, _ in marks(owner_engine, others).values())
    with pytest.raises(DBAPIError, match="no training run"):
        prune_checkpoints(engine=learning, run_id=uid("run-"), keep_last=1)
    with pytest.raises(DBAPIError, match="keep_last must be at least 1"):
        prune_checkpoints(engine=learning, run_id=other, keep_last=0)

    # No other role may call it; learning may not mark, unmark or read governance's rows.
    for service in ("execution", "governance", "web"):
        with pytest.raises(ProgrammingError, match="permission denied for function"):
            prune_checkpoints(engine=role_engine(service), run_id=other, keep_last=1)
    with learning.begin() as conn, pytest.raises(ProgrammingError, match="permission denied"):
        conn.execute(text("UPDATE checkpoint SET pruned_at = NULL, pruned_rule = NULL"
                          " WHERE id = :i"), {"i": own[0]})
    with learning.begin() as conn, pytest.raises(ProgrammingError, match="permission denied"):
        conn.execute(text("SELECT * FROM deployment"))
    born_pruned = {"id": "a" * 64, "base_model": base, "artifact_uri": "file:///x",
                   "created_by": "learning", "pruned_at": "2026-01-01", "pruned_rule": "mine"}
    with learning.begin() as conn, pytest.raises(DBAPIError, match="cannot be marked pruned"):
        conn.execute(text("INSERT INTO checkpoint (id, base_model, artifact_uri, created_by,"
                          " pruned_at, pruned_rule) VALUES (:id, :base_model, :artifact_uri,"
                          " :created_by, :pruned_at, :pruned_rule)"), born_pruned)
    # Not even the owner clears a mark: the weights are gone.
    with owner_engine.begin() as conn, pytest.raises(DBAPIError, match="never cleared"):
        conn.execute(text("UPDATE checkpoint SET pruned_at = NULL, pruned_rule = NULL"
                          " WHERE id = :i"), {"i": own[0]})


def test_a_pruned_checkpoint_cannot_be_deployed_or_served_or_rolled_back_to(
    owner_engine: Engine, role_engine: RoleEngine, settings: Settings
) -> None:
    run_id = make_run(owner_engine)
    base = make_checkpoint(owner_engine)
    c = make_chain(owner_engine, run_id, base, 3)
    prune_checkpoints(engine=role_engine("learning"), run_id=run_id, keep_last=1)
    pruned = c[0]
    rule = f"keep_last=1 of run {run_id}"

    with role_engine("governance").begin() as conn, pytest.raises(
            DBAPIError, match=f"checkpoint {pruned} was pruned on .* by {rule}"):
        conn.execute(text("INSERT INTO deployment (alias, checkpoint_id, updated_by)"
                          " VALUES (:a, :c, 'governance')"), {"a": uid("alias-"), "c": pruned})

    cache = PolicyCache(engine=role_engine("execution"), factory=_never, home=settings.home)
    with pytest.raises(CheckpointPruned, match=f"{pruned} was pruned on .* by {rule}.*served"):
        cache.get(pruned)

    with Session(role_engine("governance")) as session:
        problem = _pruned_problem(session, pruned)
    assert problem is not None and rule in problem and "rolled back to" in problem
    with Session(role_engine("governance")) as session:
        assert _pruned_problem(session, c[2]) is None


def _never(checkpoint_id: str, model_dir: Path) -> Any:
    raise AssertionError(f"a pruned checkpoint was loaded: {checkpoint_id} from {model_dir}")


async def test_a_run_asking_for_a_pruned_checkpoint_gets_the_rule(
    owner_engine: Engine, role_engine: RoleEngine, settings: Settings, opa_url: str,
    tmp_path: Path,
) -> None:
    del opa_url
    run_id = make_run(owner_engine)
    base = make_checkpoint(owner_engine)
    c = make_chain(owner_engine, run_id, base, 3)
    prune_checkpoints(engine=role_engine("learning"), run_id=run_id, keep_last=1)
    activities = UpdateActivities(
        engine=role_engine("learning"), authorizer=build_authorizer(settings, "learning"),
        artifact_dir=tmp_path / "artifacts")
    bases = BaseActivities(engine=role_engine("learning"),
                           authorizer=build_authorizer(settings, "learning"),
                           artifact_dir=tmp_path / "artifacts")
    environment = ActivityEnvironment()
    # As model.base of a new run,
    with pytest.raises(ApplicationError, match=f"{c[0]} was pruned .*model.base") as base_err:
        environment.run(bases.register_base_checkpoint,
                        RegisterBaseInput(make_run(owner_engine), c[0]))
    assert base_err.value.type == CHECKPOINT_PRUNED and base_err.value.non_retryable
    # and as the parent an update (a resume) would train from.
    config = run_config_from_data({"name": "r", "model": {"base": c[0]},
                                   "rollout": {"task_ids": ["t"]}})
    request = UpdateInput(run_id=run_id, iteration=4, parent_checkpoint_id=c[0],
                          base_checkpoint_id=base, batch_ids=["b"], config=config)
    with pytest.raises(ApplicationError, match=f"{c[0]} was pruned .*trained from") as err:
        await environment.run(activities.update_policy, request)
    assert err.value.type == CHECKPOINT_PRUNED and err.value.non_retryable


def test_pruning_deletes_files_after_the_mark(
    owner_engine: Engine, role_engine: RoleEngine, tmp_path: Path
) -> None:
    """The learner's copies under its artifact directory go; a base elsewhere stays."""
    artifacts = tmp_path / "artifacts"
    run_id = make_run(owner_engine)
    base = make_checkpoint(owner_engine)
    chain = []
    parent = base
    for iteration in (1, 2, 3):
        folder = artifacts / "checkpoints" / uid()
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"x" * 1000)
        checkpoint = make_checkpoint(owner_engine, id=uid("sha-"), parent_id=parent,
                                     run_id=run_id, base_model=base, iteration=iteration,
                                     artifact_uri=folder.as_uri())
        insert(owner_engine, "training_step", run_id=run_id, iteration=iteration,
               checkpoint_id=checkpoint, length_stats={}, metrics={})
        chain.append((checkpoint, folder))
        parent = checkpoint
    report = prune_run(engine=role_engine("learning"), files=CheckpointFiles(
        artifact_dir=artifacts), run_id=run_id, keep_last=1, retain=[chain[1][0]])
    assert [p.checkpoint_id for p in report.newly_pruned] == [chain[0][0]]
    assert report.freed_bytes == 1000
    assert [folder.exists() for _, folder in chain] == [False, True, True]
    base_uri = rows(owner_engine, "SELECT artifact_uri FROM checkpoint WHERE id = :i",
                    i=base)[0]["artifact_uri"]
    assert Path(base_uri.removeprefix("file://")).is_dir()


@pytest.mark.slow
async def test_a_run_with_keep_last_two_leaves_only_the_protected_set_on_disk(
    client: Client, settings: Settings, owner_engine: Engine, tiny_dir: Path
) -> None:
    own = queue_settings(settings)
    alice = make_user(owner_engine)
    tasks = frozen_lake_tasks(owner_engine, [1, 2])
    config = run_config(tiny_dir, tasks, schedule={"iterations": 5, "propose_every": 5},
                        checkpoints={"keep_last": 2})
    run_id = make_configured_run(owner_engine, config, alice)
    async with loops_running(client, own):
        handle = await start_run(client, own, run_id, config, alice)
        await asyncio.wait_for(handle.result(), 600)

    written = rows(owner_engine, "SELECT id, iteration, artifact_uri, pruned_at IS NOT NULL AS"
                   " pruned, pruned_rule FROM checkpoint WHERE run_id = :r ORDER BY iteration",
                   r=run_id)
    steps = rows(owner_engine, "SELECT iteration, checkpoint_id FROM training_step"
                 " WHERE run_id = :r ORDER BY iteration", r=run_id)
    proposed = {r["checkpoint_id"] for r in rows(
        owner_engine, "SELECT checkpoint_id FROM proposal WHERE run_id = :r", r=run_id)}
    protected = {s["checkpoint_id"] for s in steps[-2:]} | proposed
    for checkpoint in written:
        on_disk = Path(checkpoint["artifact_uri"].removeprefix("file://")).exists()
        assert on_disk == (checkpoint["id"] in protected), checkpoint
        assert checkpoint["pruned"] == (checkpoint["id"] not in protected), checkpoint
        if checkpoint["pruned"]:
            assert checkpoint["pruned_rule"] == f"keep_last=2 of run {run_id}"
    assert sum(not c["pruned"] for c in written) <= 2 + len(proposed)


def test_the_prune_sweep_lists_first_then_prunes(
    owner_engine: Engine, settings: Settings, opa_url: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    del opa_url
    from typer.testing import CliRunner

    from learning_loop.cli import model_app

    run_id = make_run(owner_engine)
    base = make_checkpoint(owner_engine)
    c = make_chain(owner_engine, run_id, base, 4)
    local = settings.model_copy(update={"artifact_dir": tmp_path / "artifacts"})
    monkeypatch.setattr("triloop.config.get_settings", lambda: local)
    runner = CliRunner()

    listed = runner.invoke(model_app, ["prune", "--run", run_id, "--keep-last", "2",
                                       "--dry-run"])
    assert listed.exit_code == 0, listed.output
    assert f"iteration 1: would prune {c[0]} (keep_last=2 of run {run_id})" in listed.output
    assert f"would prune {c[1]}" in listed.output and "Dry run: nothing changed" in listed.output
    assert not any(flag for flag, _ in marks(owner_engine, c).values())

    done = runner.invoke(model_app, ["prune", "--run", run_id, "--keep-last", "2"])
    assert done.exit_code == 0, done.output
    assert f"iteration 2: pruned {c[1]}" in done.output
    assert [flag for flag, _ in (marks(owner_engine, c)[i] for i in c)] == [
        True, True, False, False]
    missing = runner.invoke(model_app, ["prune", "--run", uid("run-")])
    assert missing.exit_code == 1 and "No training run" in missing.output
