"""The CLI goes where the console goes: promotion decisions, deployments, checkpoints and
their lineage, through the API with the person's token; every id argument takes a unique
prefix, and an ambiguous one is answered with its candidates.

The commands run in a thread (``invoke_cli``), their HTTP calls answered by the session's
in-process app on the session's loop, where the stand-in promotion workflow's worker polls.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import httpx
import pytest
import pytest_asyncio
from sqlalchemy import Engine
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from tests.factories import insert, make_checkpoint, uid
from tests.factories_web import (
    Person,
    add_approval,
    assert_problem,
    make_deployment,
    make_promotion,
)
from tests.integration.test_api_promotions import StandInPromotion, _start
from triloop.config import Settings
from triloop.temporal import connect
from triloop.workflow_api import GOVERNANCE_QUEUE, PROMOTION_STATUS_QUERY

if TYPE_CHECKING:  # the module is a pytest plugin here, imported by pytest first
    from tests.integration.cli_app import InvokeCli

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures", "tests.integration.cli_app"]

@pytest_asyncio.fixture(loop_scope="session")
async def governance(web_settings: Settings) -> AsyncIterator[Client]:
    client = await connect(web_settings, identity="test-cli-governance", service="governance")
    async with Worker(client, task_queue=web_settings.task_queue(GOVERNANCE_QUEUE),
                      workflows=[StandInPromotion],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        yield client


async def test_an_auditor_signs_and_an_operator_approves_from_the_cli_by_prefix(
    invoke_cli: InvokeCli, people: dict[str, Person], owner_engine: Engine, governance: Client,
    web_settings: Settings,
) -> None:
    seeded = make_promotion(owner_engine, submitted_by=people["engineer"].name,
                            current_gate="audit")
    handle = await _start(governance, web_settings, seeded)
    auditor, operator = people["auditor"], people["operator"]
    prefix = seeded.promotion_id[:12]

    blank = await invoke_cli("promotions", "sign-audit", prefix, "--comment", "   ",
                         token=auditor.token)
    assert blank.exit_code == 2 and "--comment" in blank.stderr
    signed = await invoke_cli("promotions", "sign-audit", prefix, "--comment", "lineage checked",
                          token=auditor.token)
    assert signed.exit_code == 0, signed.output
    assert (f"{auditor.name} signed the audit of promotion {seeded.promotion_id}: audit gate"
            " pass") in signed.stdout
    add_approval(owner_engine, seeded.promotion_id, "audit", auditor.name)  # as governance

    shown = await invoke_cli("promotions", "show", prefix, token=operator.token)
    assert f"{auditor.name} signed the audit: looked at the evidence" in shown.stdout
    assert "audit by" not in shown.stdout and ": approve" not in shown.stdout

    # Refusals print the policy's reasons: the auditor may not approve what they signed.
    refused = await invoke_cli("promotions", "approve", prefix, "-m", "ship", token=auditor.token)
    assert refused.exit_code == 1 and "403" in refused.stderr, refused.output
    approved = await invoke_cli("promotions", "approve", prefix, "-m", "gates green",
                            token=operator.token)
    assert approved.exit_code == 0, approved.output
    assert f"{operator.name} approved promotion {seeded.promotion_id}" in approved.stdout
    await handle.result()
    assert [d["kind"] for d in await handle.query(PROMOTION_STATUS_QUERY)] == [
        "audit", "operator"]


async def test_decisions_on_a_promotion_no_workflow_runs_are_refused_with_a_sentence(
    invoke_cli: InvokeCli, people: dict[str, Person], owner_engine: Engine,
) -> None:
    seeded = make_promotion(owner_engine, submitted_by=people["engineer"].name,
                            current_gate="stability")
    operator = people["operator"]
    for command in ("override", "override-alarms", "reject"):
        result = await invoke_cli("promotions", command, seeded.promotion_id, "--reason", "why",
                              token=operator.token)
        assert result.exit_code == 1, result.output
        assert result.stderr.startswith("error: ") and "Traceback" not in result.output
    auditor = await invoke_cli("promotions", "reject-audit", seeded.promotion_id, "-m", "no",
                           token=people["engineer"].token)
    assert auditor.exit_code == 1 and "403" in auditor.stderr


async def test_an_ambiguous_promotion_prefix_lists_the_candidates(
    invoke_cli: InvokeCli, people: dict[str, Person], owner_engine: Engine,
) -> None:
    stem = uid("pp")
    engineer = people["engineer"].name
    seeded = make_promotion(owner_engine, submitted_by=engineer)
    for suffix in ("a", "b"):
        proposal = uid("prop-")
        insert(owner_engine, "proposal", id=proposal, checkpoint_id=seeded.checkpoint_id,
               run_id=seeded.run_id, submitted_by=engineer, evidence={})
        insert(owner_engine, "promotion", id=f"{stem}{suffix}", proposal_id=proposal,
               checkpoint_id=seeded.checkpoint_id, run_id=seeded.run_id,
               submitted_by=engineer, status="open", current_gate="approval")
    result = await invoke_cli("promotions", "approve", stem, "-m", "ok",
                          token=people["operator"].token)
    assert result.exit_code == 1
    assert f"'{stem}' is ambiguous" in result.stderr
    assert f"{stem}a" in result.stderr and f"{stem}b" in result.stderr


async def test_deployments_show_says_what_serves_since_when_why_and_the_rollback_target(
    invoke_cli: InvokeCli, people: dict[str, Person], owner_engine: Engine,
) -> None:
    alias = uid("alias-").lower()
    serving, target = make_checkpoint(owner_engine), make_checkpoint(owner_engine)
    make_deployment(owner_engine, alias, serving, target)
    shown = await invoke_cli("deployments", "show", alias, token=people["operator"].token)
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert lines[0].startswith(f"{alias} serves {serving} since ")
    assert lines[1] == "  put there by governance (promote: promotion p approved by olga)"
    assert f"  rollback target: {target}" in lines
    assert "None" not in shown.stdout
    listed = await invoke_cli("deployments", "list", token=people["auditor"].token)
    assert any(row.split("\t")[:2] == [alias, serving] for row in listed.stdout.splitlines())
    missing = await invoke_cli("deployments", "show", uid("nope-"), token=people["operator"].token)
    assert missing.exit_code == 1 and "404" in missing.stderr


async def test_checkpoints_list_show_and_lineage_by_prefix(
    invoke_cli: InvokeCli, people: dict[str, Person], owner_engine: Engine, api: httpx.AsyncClient,
) -> None:
    engineer = people["engineer"]
    seeded = make_promotion(owner_engine, submitted_by=engineer.name)
    listed = await invoke_cli("checkpoints", "list", "--run", seeded.run_id[:10],
                          token=engineer.token)
    assert listed.exit_code == 0, listed.output
    ids = [row.split("\t")[0] for row in listed.stdout.splitlines()[1:]]
    assert ids == [seeded.checkpoint_id, seeded.parent_id]

    prefix = seeded.checkpoint_id[:14]
    shown = await invoke_cli("checkpoints", "show", prefix, token=engineer.token)
    assert shown.exit_code == 0 and f"checkpoint {seeded.checkpoint_id}" in shown.stdout
    lineage = await invoke_cli("checkpoints", "lineage", prefix, token=people["auditor"].token)
    assert lineage.exit_code == 0, lineage.output
    chain = [line.strip().split(":")[0] for line in lineage.stdout.splitlines()[1:4]]
    assert chain == [seeded.root_id, seeded.parent_id, seeded.checkpoint_id]
    assert f"promotion {seeded.promotion_id}: open at approval" in lineage.stdout

    # The API takes the prefix itself: /api/checkpoints/{id} and its lineage.
    by_prefix = await api.get(f"/api/checkpoints/{prefix}/lineage", headers=engineer.headers)
    assert by_prefix.status_code == 200, by_prefix.text
    assert by_prefix.json()["candidate_id"] == seeded.checkpoint_id
    one = await api.get(f"/api/checkpoints/{prefix}", headers=engineer.headers)
    assert one.json()["id"] == seeded.checkpoint_id
    stem = uid("sha-amb-")
    first, second = (make_checkpoint(owner_engine, id=f"{stem}{s}") for s in ("a", "b"))
    ambiguous = await api.get(f"/api/checkpoints/{stem}/lineage", headers=engineer.headers)
    body = assert_problem(ambiguous, 422, "ambiguous", first, second)
    assert body["reasons"] == [first, second]
    assert_problem(await api.get(f"/api/checkpoints/{stem}z", headers=engineer.headers), 404)
    cli_ambiguous = await invoke_cli("checkpoints", "lineage", stem, token=engineer.token)
    assert cli_ambiguous.exit_code == 1 and f"'{stem}' is ambiguous" in cli_ambiguous.stderr


async def test_a_second_admin_confirms_a_grant_by_a_prefix_of_its_id(
    invoke_cli: InvokeCli, people: dict[str, Person], owner_engine: Engine, api: httpx.AsyncClient,
) -> None:
    from tests.factories_web import make_user

    first, second = people["admin"], make_user(owner_engine, "admin")
    person = make_user(owner_engine, "ml_engineer")
    asked = await api.post(f"/api/users/{person.name}/roles", json={"role": "auditor"},
                           headers=first.headers)
    assert asked.status_code == 201, asked.text
    grant_id = asked.json()["id"]
    confirmed = await invoke_cli("users", "confirm", grant_id[:10], token=second.token)
    assert confirmed.exit_code == 0, confirmed.output
    assert confirmed.stdout.split()[:4] == [grant_id, person.name, "auditor", "active"]
    unknown = await invoke_cli("users", "refuse-grant", uid("zz"), token=second.token)
    assert unknown.exit_code == 1 and "no role grant has an id starting with" in unknown.stderr
