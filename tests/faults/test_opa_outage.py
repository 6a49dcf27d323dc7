"""OPA stopped: every privileged action is denied and nothing is written; OPA back: work resumes.

The test runs an OPA server of its own (the session's is shared with other tests).
The actions come from the policy itself (its ``service_grants`` and ``role_grants``
tables, read from the running OPA): while OPA is up, the ones the policy grants are
allowed; while it is down, ``Authorizer.authorize`` refuses every one with a
fail-closed reason. A rollout batch started during the outage writes no trajectory
and no step, and every refusal is audited; once OPA is started again on the same
port, the same in-process worker runs the same batch to the end.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import Engine, text

from execution_loop.worker import build_worker
from tests.factories import make_person, person_token
from tests.factories_execution import make_builtin_task, register_checkpoint_dir, request_batch
from tests.faults.conftest import (
    assert_each_episode_whole_and_once,
    batch_result,
    own_queues,
    scripted_policy,
    trajectory_rows,
)
from triloop.config import SERVICES, Settings
from triloop.db import engine_for_url
from triloop.devstack.servers import repo_root, tool_path
from triloop.policy import Actor, Authorizer, PolicyDenied, Resource
from triloop.temporal import connect
from triloop.wiring import build_authorizer
from triloop.workflow_api import (
    EXECUTION_QUEUE,
    ROLLOUT_WORKFLOW,
    RolloutBatchInput,
    RolloutBatchResult,
    RolloutItem,
)

if TYPE_CHECKING:
    from temporalio.client import Client

    from tests.faults.conftest import RestartableService

pytestmark = [pytest.mark.faults, pytest.mark.integration, pytest.mark.slow,
              pytest.mark.timeout(120)]

EPISODES = 4
# Facts some duties ask for: a submitter, an auditor and an approver who differ.
DUTY_ATTRS = {"submitted_by": "fault-ml", "audited_by": "fault-auditor",
              "approved_by": "fault-operator", "rollback_target": "ckpt-prev"}


def privileged_actions(owner: Engine) -> list[tuple[Actor, str, Resource]]:
    """Every non-read action the policy's own tables grant a service or a human role.

    Each human role is a real person with a live token: the audit log names a person only
    with the credential they presented (issue 32, route 8).
    """
    def table(name: str) -> dict[str, Any]:
        # Read from the Rego files with `opa eval`: the server answers decisions only.
        out = subprocess.run(
            [tool_path("opa"), "eval", "--format", "json", "--data",
             str(repo_root() / "policies"), f"data.triloop.authz.{name}"],
            check=True, capture_output=True, text=True).stdout
        return dict(json.loads(out)["result"][0]["expressions"][0]["value"])

    found: list[tuple[Actor, str, Resource]] = []
    for service, kinds in table("service_grants").items():
        for kind, actions in kinds.items():
            found += [(Actor(service=service), action, Resource(kind, f"fault-{kind}",
                                                                 attrs=DUTY_ATTRS))
                      for action in actions if action != "read"]
    for role, kinds in table("role_grants").items():
        name = make_person(owner, f"fault-{role}", [role])
        person = Actor(service="web", user=name, roles=(role,),
                       credential=person_token(owner, name))
        for kind, actions in kinds.items():
            found += [(person, action, Resource(kind, f"fault-{kind}", owner=person.user,
                                                attrs=DUTY_ATTRS)) for action in actions]
    return found


def authorizers(settings: Settings) -> dict[str, Authorizer]:
    """Each service's own authorizer (OPA client and audit sink), as its wiring builds it."""
    return {service: build_authorizer(settings, service) for service in SERVICES}


def allowed(by_service: dict[str, Authorizer], request: tuple[Actor, str, Resource]) -> bool:
    """Ask through the actor's service's authorizer (which audits); False when denied."""
    actor, action, resource = request
    try:
        by_service[actor.service].authorize(actor, action, resource)
    except PolicyDenied as denied:
        assert denied.decision.reasons, "a denial must say why"
        return False
    return True


async def run_batch(client: Client, settings: Settings, batch: RolloutBatchInput
                    ) -> RolloutBatchResult:
    """Start the batch on the test's queue and wait for its result."""
    handle = await client.start_workflow(
        ROLLOUT_WORKFLOW, request_batch(engine_for_url(settings.owner_url()), batch),
        id=f"rollout-{batch.batch_id}",
        task_queue=settings.task_queue(EXECUTION_QUEUE), result_type=RolloutBatchResult)
    return await batch_result(handle, timeout_s=60)


def audited_decisions(engine: Engine, batch_id: str) -> list[tuple[str, list[str]]]:
    """(decision, reasons) of every audited trajectory decision of the batch."""
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT decision, payload->'reasons' FROM audit_event WHERE action = 'create' "
            "AND resource->>'kind' = 'trajectory' AND resource->>'id' LIKE :b ORDER BY seq"),
            {"b": f"{batch_id}:%"}).all()
    return [(str(r[0]), list(r[1])) for r in rows]


async def test_opa_outage_denies_every_privileged_action_then_work_resumes(
    settings: Settings, owner_engine: Engine, restartable_opa: RestartableService,
    scripted_model_dir: Path,
) -> None:
    opa = restartable_opa
    test_settings = own_queues(settings, opa_url=opa.address)
    requests = privileged_actions(owner_engine)
    by_service = authorizers(test_settings)
    granted = [r for r in requests if allowed(by_service, r)]
    # The policy grants each loop its own writes: a broken table would make this test moot.
    assert {(a.service, act, r.kind) for a, act, r in granted} >= {
        ("execution", "create", "trajectory"), ("learning", "propose", "checkpoint"),
        ("governance", "promote", "promotion"), ("governance", "rollback", "deployment")}

    checkpoint = register_checkpoint_dir(owner_engine, scripted_model_dir)
    task = make_builtin_task(owner_engine, "frozen_lake", seed=12)
    batch = RolloutBatchInput(
        batch_id=f"opa{uuid.uuid4().hex[:8]}", purpose="training", checkpoint_id=checkpoint,
        items=[RolloutItem(task, 12, group_size=EPISODES)], max_concurrency=EPISODES,
        deadline_s=60, heartbeat_timeout_s=5,
    )
    client = await connect(test_settings, identity="fault-test", service="execution")
    async with build_worker(client, test_settings, policy_factory=scripted_policy(0.02)):
        await opa.astop()

        # Every privileged action, allowed a moment ago, now fails closed.
        for actor, action, resource in requests:
            with pytest.raises(PolicyDenied) as refused:
                by_service[actor.service].authorize(actor, action, resource)
            (reason,) = refused.value.decision.reasons
            assert reason.startswith("failed closed: OPA at") and "unreachable" in reason
            assert refused.value.decision.decision_id is None

        down = await run_batch(client, test_settings, batch)
        assert (down.failed, down.trajectory_ids) == (EPISODES, [])
        assert trajectory_rows(owner_engine, batch.batch_id) == []
        with owner_engine.connect() as conn:
            steps = conn.execute(text("SELECT count(*) FROM step WHERE trajectory_id LIKE :b"),
                                 {"b": f"{batch.batch_id}:%"}).scalar_one()
        assert steps == 0
        # The batch's one group asks once for the set of its episodes (one decision each
        # group, naming every episode); OPA being down, that one is an audited denial.
        refusals = audited_decisions(owner_engine, batch.batch_id)
        assert len(refusals) == 1
        assert all(d == "deny" and r[0].startswith("failed closed") for d, r in refusals)
        with owner_engine.connect() as conn:
            named = conn.execute(text(
                "SELECT resource->'attrs'->'trajectory_ids' FROM audit_event WHERE action ="
                " 'create' AND resource->>'kind' = 'trajectory' AND resource->>'id' LIKE :b"),
                {"b": f"{batch.batch_id}:%"}).scalar_one()
        assert sorted(named) == [f"{batch.batch_id}:0:{i}" for i in range(EPISODES)]

        await opa.astart()
        # The worker kept running through the outage; the same batch now goes through.
        again = await run_batch(client, test_settings, batch)

    expected = [f"{batch.batch_id}:0:{i}" for i in range(EPISODES)]
    assert again.failed == 0 and sorted(again.trajectory_ids) == sorted(expected)
    assert_each_episode_whole_and_once(trajectory_rows(owner_engine, batch.batch_id), expected)
    decisions = [d for d, _ in audited_decisions(owner_engine, batch.batch_id)]
    assert decisions == ["deny", "allow"]  # one decision for the group's set, each time
    assert all(allowed(by_service, r) for r in granted), "OPA came back with other answers"

    print(  # noqa: T201 - the numbers for the closing note (pytest -s)
        f"\n[opa outage] outage {opa.outages_s[0]:.1f}s; {len(requests)} privileged actions "
        f"from the policy tables, {len(granted)} allowed while up, all {len(requests)} denied "
        f"(failed closed) while down; batch during outage: {down.failed}/{EPISODES} failed, "
        f"0 trajectories, {len(refusals)} audited denials; same batch after restart: "
        f"{len(again.trajectory_ids)}/{EPISODES} stored whole"
    )
