"""Transcripts through the API: who reads which episodes, turns with their tokens, paging,
ids by prefix, the access log, the promotion's sample and what an audit sign-off records.

Runs as ``triloop_web`` against the real PostgreSQL, OPA and Temporal; the sign-off goes to
a stand-in promotion workflow (the real name, this module's governance queue).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from sqlalchemy import Engine, text
from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from tests.factories_transcripts import PromotionEpisodes, promotion_with_episodes
from tests.factories_web import Person, assert_problem
from triloop.config import Settings
from triloop.temporal import connect
from triloop.workflow_api import (
    GOVERNANCE_QUEUE,
    PROMOTION_SIGN_AUDIT_UPDATE,
    PROMOTION_WORKFLOW,
    DecisionRef,
    GateSummary,
    PromotionInput,
)

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]


@workflow.defn(name=PROMOTION_WORKFLOW)
class StandInAudit:
    """Takes one audit decision and ends; writes nothing."""

    def __init__(self) -> None:
        self.signed = False

    @workflow.run
    async def run(self, candidate: PromotionInput) -> None:
        await workflow.wait_condition(lambda: self.signed)

    @workflow.update(name=PROMOTION_SIGN_AUDIT_UPDATE)
    def sign_audit(self, decision: DecisionRef) -> GateSummary:
        self.signed = True
        return GateSummary(gate="audit", passed=True, verdict="pass", reasons=["recorded"])


@pytest_asyncio.fixture(loop_scope="session")
async def governance(web_settings: Settings) -> AsyncIterator[Client]:
    client = await connect(web_settings, identity="test-transcripts-governance",
                           service="governance")
    async with Worker(client, task_queue=web_settings.task_queue(GOVERNANCE_QUEUE),
                      workflows=[StandInAudit], workflow_runner=UnsandboxedWorkflowRunner()):
        yield client


@pytest.fixture
def made(owner_engine: Engine, people: dict[str, Person]) -> PromotionEpisodes:
    return promotion_with_episodes(owner_engine, submitted_by=people["engineer"].name)


def _reads(engine: Engine, user: str, trajectory_id: str) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT actor, action, resource, db_role, decision_id FROM access_event"
            " WHERE actor->>'user' = :u AND resource->>'id' = :t ORDER BY id"),
            {"u": user, "t": trajectory_id}).mappings().all()
    return [dict(r) for r in rows]


async def test_an_auditor_reads_an_eval_transcript_turn_by_turn(
    api: httpx.AsyncClient, people: dict[str, Person], made: PromotionEpisodes,
    owner_engine: Engine,
) -> None:
    auditor = people["auditor"]
    episode = made.candidate[made.tasks[0]][0]
    header = await api.get(f"/api/trajectories/{episode}", headers=auditor.headers)
    assert header.status_code == 200, header.text
    body = header.json()
    assert (body["purpose"], body["task_id"], body["checkpoint_id"]) == (
        "eval", made.tasks[0], made.seeded.checkpoint_id)
    assert body["verdict"]["success"] is True and body["verdict"]["recorded_by"]
    assert body["verdict_success"] is True
    assert body["sandbox"] == {"backend": "bubblewrap", "network": False}
    first = await api.get(f"/api/trajectories/{episode}/turns", params={"limit": 1},
                          headers=auditor.headers)
    assert first.status_code == 200, first.text
    page = first.json()
    assert page["num_steps"] == 2 and len(page["items"]) == 1 and page["next_cursor"]
    turn = page["items"][0]
    assert turn["observation"].startswith("turn 0") and turn["action_text"] == "move right (0)"
    assert turn["feedback"] == {"reward_terms": {"valid_action": 0.1}}
    assert turn["tokens"] == {"token_ids": [100, 200, 300, 400], "trained": [0, 0, 1, 1],
                              "behaviour_logprobs": [None, None, -0.5, -0.25],
                              "action_start": 2}
    rest = await api.get(f"/api/trajectories/{episode}/turns",
                         params={"limit": 1, "cursor": page["next_cursor"]},
                         headers=auditor.headers)
    second = rest.json()
    assert [t["index"] for t in second["items"]] == [1] and second["next_cursor"] is None
    # Logprobs follow the trained tokens across turns, not the positions.
    assert second["items"][0]["tokens"]["behaviour_logprobs"] == [None, None, -1.5, -1.25]
    reads = _reads(owner_engine, auditor.name, episode)
    assert len(reads) == 3
    assert all(r["action"] == "read" and r["db_role"] == "triloop_web" and r["decision_id"]
               and r["resource"]["kind"] == "trajectory"
               and r["resource"]["attrs"] == {"purpose": "eval"} for r in reads)


async def test_an_operator_reads_eval_and_shadow_transcripts(
    api: httpx.AsyncClient, people: dict[str, Person], made: PromotionEpisodes,
) -> None:
    for episode in (made.baseline[made.tasks[1]][0], made.shadow[0]):
        response = await api.get(f"/api/trajectories/{episode}",
                                 headers=people["operator"].headers)
        assert response.status_code == 200, response.text


async def test_an_engineer_may_not_read_eval_transcripts_even_of_their_own_candidate(
    api: httpx.AsyncClient, people: dict[str, Person], made: PromotionEpisodes,
    owner_engine: Engine,
) -> None:
    engineer = people["engineer"]
    episode = made.candidate[made.tasks[0]][0]
    for path in (f"/api/trajectories/{episode}", f"/api/trajectories/{episode}/turns"):
        assert_problem(await api.get(path, headers=engineer.headers), 403,
                       "auditors and operators only", f"{engineer.name} holds roles ml_engineer")
    listed = await api.get("/api/trajectories", params={"promotion_id": made.seeded.promotion_id},
                           headers=engineer.headers)
    assert_problem(listed, 403, "auditors and operators only")
    assert _reads(owner_engine, engineer.name, episode) == []  # a refusal is no read
    with owner_engine.connect() as conn:
        denied = conn.execute(text(
            "SELECT count(*) FROM audit_event WHERE actor->>'user' = :u AND decision = 'deny'"
            " AND resource->>'id' = :t"), {"u": engineer.name, "t": episode}).scalar_one()
    assert denied == 2  # the denials are decisions, in the chain


async def test_an_engineer_reads_their_own_runs_training_transcripts_only(
    api: httpx.AsyncClient, people: dict[str, Person], made: PromotionEpisodes,
) -> None:
    run_id = made.seeded.run_id
    owner = people["engineer"]
    listed = await api.get("/api/trajectories", params={"run_id": run_id, "iteration": 3},
                           headers=owner.headers)
    assert listed.status_code == 200, listed.text
    assert sorted(e["id"] for e in listed.json()["items"]) == sorted(made.training)
    assert {e["status"] for e in listed.json()["items"]} == {"failed"}
    other_iteration = await api.get("/api/trajectories", params={"run_id": run_id,
                                                                 "iteration": 30},
                                    headers=owner.headers)
    assert other_iteration.json()["items"] == []
    header = await api.get(f"/api/trajectories/{made.training[0]}", headers=owner.headers)
    assert header.status_code == 200 and header.json()["submitted_by"] == owner.name
    for who in ("engineer2", "operator", "admin"):
        person = people[who]
        assert_problem(await api.get(f"/api/trajectories/{made.training[0]}",
                                     headers=person.headers),
                       403, f"submitted the run ({owner.name})")
        assert_problem(await api.get("/api/trajectories", params={"run_id": run_id},
                                     headers=person.headers), 403, "submitted the run")
    audited = await api.get(f"/api/trajectories/{made.training[0]}",
                            headers=people["auditor"].headers)
    assert audited.status_code == 200


async def test_an_admin_reads_no_judged_transcript(
    api: httpx.AsyncClient, people: dict[str, Person], made: PromotionEpisodes,
) -> None:
    assert_problem(await api.get(f"/api/trajectories/{made.shadow[0]}",
                                 headers=people["admin"].headers),
                   403, "auditors and operators only")


async def test_ids_by_prefix_unknown_and_ambiguous(
    api: httpx.AsyncClient, people: dict[str, Person], made: PromotionEpisodes,
) -> None:
    auditor = people["auditor"]
    episode = made.shadow[0]
    unique = await api.get(f"/api/trajectories/{episode[:-3]}", headers=auditor.headers)
    assert unique.status_code == 200 and unique.json()["id"] == episode
    # Every eval episode of the promotion starts with its workflow id: ambiguous.
    shared = made.seeded.workflow_id
    body = assert_problem(await api.get(f"/api/trajectories/{shared}", headers=auditor.headers),
                          409, "more than one episode id", "give more characters")
    assert made.candidate[made.tasks[0]][0] in body["detail"]
    assert_problem(await api.get("/api/trajectories/no-such-episode-at-all",
                                 headers=auditor.headers), 404, "no-such-episode-at-all")
    # A short prefix is not searched: 7 characters name too many episodes.
    assert_problem(await api.get(f"/api/trajectories/{episode[:7]}", headers=auditor.headers),
                   404)


@pytest.mark.parametrize(("path", "params", "needle"), [
    ("/api/trajectories", {"purpose": "exam"}, "purpose"),
    ("/api/trajectories", {}, "name which episodes to list"),
    ("/api/trajectories", {"iteration": 2, "purpose": "training"}, "iteration needs run_id"),
    ("/api/trajectories", {"purpose": "eval", "limit": 0}, "limit"),
    ("/api/trajectories", {"purpose": "eval", "cursor": "bm90LW91cnM"}, "cursor"),
    ("/api/trajectories", {"purpose": "eval", "status": "sideways"}, "status"),
    ("/api/trajectories", {"run_id": "r", "iteration": "1.0"}, "iteration"),
])
async def test_bad_list_parameters_are_422(
    api: httpx.AsyncClient, people: dict[str, Person], path: str, params: dict[str, Any],
    needle: str,
) -> None:
    assert_problem(await api.get(path, params=params, headers=people["auditor"].headers), 422,
                   needle)


async def test_bad_turn_parameters_are_422(
    api: httpx.AsyncClient, people: dict[str, Person], made: PromotionEpisodes,
) -> None:
    episode = made.shadow[0]
    for params in ({"limit": 500}, {"cursor": "bm90LW91cnM"}, {"cursor": "!!"}):
        assert_problem(await api.get(f"/api/trajectories/{episode}/turns", params=params,
                                     headers=people["auditor"].headers), 422)


async def test_lists_page_and_filter(
    api: httpx.AsyncClient, people: dict[str, Person], made: PromotionEpisodes,
) -> None:
    auditor = people["auditor"]
    promotion = made.seeded.promotion_id
    seen: list[str] = []
    cursor = None
    while True:
        params = {"promotion_id": promotion, "limit": 3, **({"cursor": cursor} if cursor else {})}
        page = (await api.get("/api/trajectories", params=params, headers=auditor.headers)).json()
        seen += [e["id"] for e in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    everything = [e for arm in (made.candidate, made.baseline) for es in arm.values() for e in es]
    assert sorted(seen) == sorted(everything + made.shadow)  # no training episode, no repeat
    failed = await api.get("/api/trajectories", params={
        "promotion_id": promotion, "checkpoint_id": made.seeded.checkpoint_id,
        "task_id": made.tasks[1], "purpose": "eval"}, headers=auditor.headers)
    assert sorted(e["id"] for e in failed.json()["items"]) == sorted(made.candidate[made.tasks[1]])


async def test_the_promotion_sample_is_stratified_and_the_same_every_time(
    api: httpx.AsyncClient, people: dict[str, Person], made: PromotionEpisodes,
) -> None:
    path = f"/api/promotions/{made.seeded.promotion_id}/transcripts"
    first = await api.get(path, headers=people["auditor"].headers)
    assert first.status_code == 200, first.text
    sample = first.json()
    assert sample == (await api.get(path, headers=people["auditor"].headers)).json()
    assert sample["tasks_total"] == 2
    # The task where the arms disagree (the baseline only fails task 2) comes first.
    assert [t["task_id"] for t in sample["tasks"]] == [made.tasks[1], made.tasks[0]]
    disagreeing = sample["tasks"][0]
    assert disagreeing["candidate"]["success"]["id"] == made.candidate[made.tasks[1]][0]
    assert disagreeing["candidate"]["failure"]["id"] == made.candidate[made.tasks[1]][1]
    assert disagreeing["baseline"]["success"] is None
    assert disagreeing["baseline"]["successes"] == 0 and disagreeing["baseline"]["episodes"] == 2
    assert_problem(await api.get(path, headers=people["engineer2"].headers), 403,
                   "auditors and operators only")
    assert_problem(await api.get("/api/promotions/nope/transcripts",
                                 headers=people["auditor"].headers), 404)


async def test_the_sign_off_records_the_transcripts_the_auditor_read(
    api: httpx.AsyncClient, people: dict[str, Person], made: PromotionEpisodes,
    owner_engine: Engine, governance: Client, web_settings: Settings,
) -> None:
    seeded = made.seeded
    await governance.start_workflow(
        PROMOTION_WORKFLOW, PromotionInput(proposal_id="p", checkpoint_id=seeded.checkpoint_id,
                                           run_id=seeded.run_id, submitted_by="x"),
        id=seeded.workflow_id, task_queue=web_settings.task_queue(GOVERNANCE_QUEUE))
    auditor = people["auditor_operator"]
    read_first = made.baseline[made.tasks[1]][1]
    read_second = made.candidate[made.tasks[0]][0]
    await api.get(f"/api/trajectories/{read_first}/turns", headers=auditor.headers)
    await api.get(f"/api/trajectories/{read_second}", headers=auditor.headers)
    await api.get(f"/api/trajectories/{read_first}", headers=auditor.headers)  # once is enough
    # Another promotion's episode, and another person's reads, are not this sign-off's.
    other = promotion_with_episodes(owner_engine, submitted_by=people["engineer"].name)
    await api.get(f"/api/trajectories/{other.shadow[0]}", headers=auditor.headers)
    await api.get(f"/api/trajectories/{made.shadow[0]}", headers=people["auditor"].headers)
    signed = await api.post(f"/api/promotions/{seeded.promotion_id}/sign-audit",
                            json={"comment": "read the sampled transcripts",
                                  "shown_transcripts": ["made-up"]},
                            headers=auditor.headers)
    assert signed.status_code in (200, 422), signed.text
    if signed.status_code == 422:  # the body is strict: send only the comment
        signed = await api.post(f"/api/promotions/{seeded.promotion_id}/sign-audit",
                                json={"comment": "read the sampled transcripts"},
                                headers=auditor.headers)
    assert signed.status_code == 200, signed.text
    with owner_engine.connect() as conn:
        details = conn.execute(text(
            "SELECT details FROM human_decision WHERE subject = :p AND kind = 'audit'"),
            {"p": seeded.promotion_id}).scalar_one()
    assert details["shown_transcripts"] == [read_first, read_second]
    sample = (await api.get(f"/api/promotions/{seeded.promotion_id}/transcripts",
                            headers=auditor.headers)).json()
    assert details["sampled_transcripts"] == [
        e["id"] for t in sample["tasks"] for arm in (t["candidate"], t["baseline"]) if arm
        for e in (arm["success"], arm["failure"]) if e]


def test_the_learning_role_cannot_read_eval_transcripts_with_its_own_password(
    role_engine: Any, made: PromotionEpisodes,
) -> None:
    """Row-level security (0011, 0018): logged in as ``triloop_learning`` with its own
    password, the eval and shadow episodes, their steps and tokens are not there."""
    from sqlalchemy.exc import ProgrammingError

    judged = [*made.candidate[made.tasks[0]], made.shadow[0]]
    learning = role_engine("learning")
    with learning.connect() as conn:
        assert conn.execute(text("SELECT current_user")).scalar_one() == "triloop_learning"
        for table in ("trajectory", "learning_step", "learning_trajectory_sequence"):
            key = "id" if table == "trajectory" else "trajectory_id"
            seen = conn.execute(text(f"SELECT count(*) FROM {table} WHERE {key} = ANY(:ids)"),
                                {"ids": judged}).scalar_one()
            assert seen == 0, table
        # Its own run's training episodes it does see (the refusal is about purpose).
        assert conn.execute(text("SELECT count(*) FROM trajectory WHERE id = ANY(:ids)"),
                            {"ids": made.training}).scalar_one() == 2
    for table in ("step", "trajectory_sequence"):
        with pytest.raises(ProgrammingError) as refused, learning.connect() as conn:
            conn.execute(text(f"SELECT * FROM {table} WHERE trajectory_id = :t"),
                         {"t": judged[0]})
        assert getattr(refused.value.orig, "sqlstate", None) == "42501"
    # The web role reads them (the policy decides per person, above).
    with role_engine("web").connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM trajectory WHERE id = ANY(:ids)"),
                            {"ids": judged}).scalar_one() == 3
