"""Set-up of the demo's governed world: people, environments, admitted tasks, eval set, thresholds.

Each step goes through the same library calls the CLI uses (``authorize()`` first,
each service's own database role), in-process so the demo stays quick. Names carry
a per-demo suffix, so running the demo again on a stack that is still up adds a
fresh world beside the old one instead of colliding with it.
"""

from __future__ import annotations

import asyncio
import getpass
import socket
from dataclasses import dataclass, field

from triloop.config import Settings
from triloop.db import role_engine, session_scope
from triloop.policy import Actor, Resource
from triloop.temporal import connect
from triloop.wiring import build_authorizer

OPERATOR_ROLES = ["operator"]
TRAINING_SEEDS = (11, 12, 13, 14)
EVAL_SEEDS = (11, 12, 13, 14)
CI_SEEDS = (1, 2)


@dataclass
class Person:
    """A demo user and their API token."""

    name: str
    roles: list[str]
    token: str


@dataclass
class World:
    """Everything the demo created, by name."""

    people: dict[str, Person] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    training_tasks: list[str] = field(default_factory=list)
    regression_tasks: list[str] = field(default_factory=list)
    eval_set_id: str = ""
    threshold_id: str = ""


def create_people(settings: Settings, suffix: str) -> dict[str, Person]:
    """An ML engineer, an auditor and an operator, as an admin would create them."""
    from web.users import check_new_user, create_user

    admin = Actor(service="web", user=f"{getpass.getuser()}@demo", roles=("admin",))
    authorizer = build_authorizer(settings, "web")
    people: dict[str, Person] = {}
    for role, first_name in (("ml_engineer", "maya"), ("auditor", "ada"), ("operator", "olga")):
        name = f"{first_name}-{suffix}"
        roles = check_new_user(name, [role])
        authorizer.authorize(admin, "create", Resource(kind="user", id=name,
                                                       attrs={"via": "demo"}))
        with session_scope(role_engine(settings, "web")) as session:
            _, token = create_user(session=session, name=name, roles=roles,
                                   created_by=admin.user or "demo",
                                   token_lifetime_s=settings.api_token_lifetime_s)
        people[role] = Person(name, roles, token)
    return people


def register_environments(settings: Settings, operator: Person) -> dict[str, str]:
    """Register the three built-in contracts as environment versions (governance)."""
    from execution_loop.environments.registry import builtin_contract_path
    from governance_loop.environments import document_from_file, register_environment_version

    engine = role_engine(settings, "governance")
    authorizer = build_authorizer(settings, "governance")
    versions = {}
    for name in ("frozen_lake", "tool_arithmetic", "fix_ci_failure"):
        result = register_environment_version(
            engine=engine, authorizer=authorizer,
            document=document_from_file(builtin_contract_path(name)),
            requested_by=operator.name, roles=operator.roles,
        )
        versions[name] = result.id
    return versions


def add_tasks(settings: Settings, version_id: str, seeds: tuple[int, ...],
              operator: Person) -> list[str]:
    """Pending tasks on a version, one per seed."""
    from governance_loop.environments import add_task

    engine = role_engine(settings, "governance")
    authorizer = build_authorizer(settings, "governance")
    return [add_task(engine=engine, authorizer=authorizer, version_ref=version_id, seed=seed,
                     requested_by=operator.name, roles=operator.roles) for seed in seeds]


async def admit_tasks(settings: Settings, task_ids: list[str], operator: Person) -> list[str]:
    """Run each task's AdmissionWorkflow (the four questions), then the operator admits it."""
    from temporalio.common import WorkflowIDConflictPolicy

    from triloop.workflow_api import (
        ADMISSION_DECIDE_UPDATE,
        ADMISSION_STATUS_QUERY,
        ADMISSION_WORKFLOW,
        GOVERNANCE_QUEUE,
        AdmissionInput,
        AdmissionResult,
        HumanDecision,
        admission_workflow_id,
    )

    client = await connect(settings, identity=f"demo-operator@{socket.gethostname()}")

    async def admit(task_id: str) -> str:
        handle = await client.start_workflow(
            ADMISSION_WORKFLOW, AdmissionInput(task_id=task_id, requested_by=operator.name),
            id=admission_workflow_id(task_id), task_queue=settings.task_queue(GOVERNANCE_QUEUE),
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        status: AdmissionResult = await handle.query(ADMISSION_STATUS_QUERY,
                                                     result_type=AdmissionResult)
        while status.status == "assessing":
            await asyncio.sleep(0.5)
            status = await handle.query(ADMISSION_STATUS_QUERY, result_type=AdmissionResult)
        if status.status == "awaiting_decision":
            status = await handle.execute_update(
                ADMISSION_DECIDE_UPDATE,
                HumanDecision(user=operator.name, roles=operator.roles, decision="approve",
                              comment="evidence answers all four questions", service="cli"),
                result_type=AdmissionResult,
            )
        answers = ", ".join(reason.split(":")[0] for reason in status.reasons if ": ok" in reason)
        return f"{task_id[:12]}… {status.status}: {answers or '; '.join(status.reasons)}"

    return list(await asyncio.gather(*(admit(task) for task in task_ids)))


def freeze_eval_set_and_threshold(settings: Settings, task_ids: list[str],
                                  operator: Person) -> tuple[str, str, str]:
    """A frozen eval set and the ``promotion`` threshold that gates candidates on it."""
    from governance_loop.evalsets import create_eval_set, set_threshold

    engine = role_engine(settings, "governance")
    authorizer = build_authorizer(settings, "governance")
    eval_set = create_eval_set(engine=engine, authorizer=authorizer, name="frozen-lake-maps",
                               task_ids=task_ids, requested_by=operator.name,
                               roles=operator.roles, freeze=True)
    threshold = set_threshold(
        engine=engine, authorizer=authorizer, name="promotion", eval_set=eval_set.id,
        requested_by=operator.name, roles=operator.roles, spec=DEMO_THRESHOLDS,
    )
    return eval_set.id, eval_set.content_hash or "", threshold.id


# Sized for a demo of a few hundred episodes: small minimum samples, large effects.
DEMO_THRESHOLDS = {
    "min_success_rate": 0.0,
    "max_regression_vs_production": 0.05,
    "max_reward_regression_vs_production": 0.0,
    "min_samples": 16,
    "shadow": {"min_samples": 12, "agreement_floor": 0.2, "max_mean_reward_regression": 0.2},
    "canary": {"min_samples_per_arm": 16, "regression_to_detect": 0.2},
    "watch": {"min_samples": 16, "regression_to_detect": 0.2, "max_reward_regression": 0.1},
}
