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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from triloop.config import Settings
from triloop.db import owner_engine, role_engine, session_scope
from triloop.policy import Actor, Resource
from triloop.temporal import connect
from triloop.wiring import build_authorizer

OPERATOR_ROLES = ["operator"]
# Three disjoint sets of frozen_lake maps: what the run trains on, what governance judges
# candidates on (held out: an eval set may not share a map with any run), and what
# production traffic plays.
TRAINING_SEEDS = (11, 12, 13, 14)
EVAL_SEEDS = (21, 22, 23, 24)
TRAFFIC_SEEDS = (31, 32, 33, 34)
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


# The two founding admins: one asks for a privileged role, the other confirms it.
FOUNDING_ADMINS = (("demo-admin", "demo-admin-token"), ("demo-admin-2", "demo-admin-2-token"))


def admin_token(settings: Settings, name: str, secret: str) -> str:
    """A founding admin's API token, made on the server and kept as a secret (mode 0600).

    ``triloop users create`` makes founding admins only while fewer than two admins exist;
    a later demo on the same stack reads each token back from the secrets folder.
    """
    from triloop.secrets import read_secret, write_secret
    from web.users import UserError, create_first_admin

    stored = read_secret(settings.secrets, secret)
    if stored is not None:
        return stored
    # On the server as the database's owner, as `triloop users create` does: the web role
    # never writes an admin, and the local actor is no person whose credential it could check.
    admin = Actor(service="web", user=f"{getpass.getuser()}@demo", roles=("admin",))
    server = owner_engine(settings)
    build_authorizer(settings, "web", audit_engine=server).authorize(
        admin, "create", Resource(kind="user", id=name, attrs={"founding_admin": True}))
    try:
        with session_scope(server) as session:
            _, token = create_first_admin(session=session, name=name,
                                          created_by=admin.user or "demo",
                                          token_lifetime_s=settings.api_token_lifetime_s)
    except UserError as exc:
        raise SystemExit(
            f"{exc}. Put an admin's API token in {settings.secrets / secret}"
            " to run the demo on this stack.") from exc
    write_secret(settings.secrets, secret, token)
    return token


def create_people(settings: Settings, suffix: str, api_base: str) -> dict[str, Person]:
    """An ML engineer, an auditor and an operator, created by the first admin through the API;
    the second admin confirms the auditor's and the operator's pending role grants."""
    import httpx

    from triloop.secrets import write_secret

    first, second = (admin_token(settings, name, secret) for name, secret in FOUNDING_ADMINS)
    people: dict[str, Person] = {}
    for role, first_name in (("ml_engineer", "maya"), ("auditor", "ada"), ("operator", "olga")):
        response = httpx.post(f"{api_base}/api/users", timeout=60,
                              headers={"Authorization": f"Bearer {first}"},
                              json={"name": f"{first_name}-{suffix}", "roles": [role]})
        if response.status_code != 201:
            raise SystemExit(f"creating {first_name} through the API failed:"
                             f" {response.status_code} {response.text[:400]}")
        created = response.json()
        roles = list(created["roles"])
        for grant in created.get("pending_grants") or []:
            confirmed = httpx.post(f"{api_base}/api/role-grants/{grant['id']}/confirm",
                                   timeout=60, headers={"Authorization": f"Bearer {second}"})
            if confirmed.status_code != 200:
                raise SystemExit(f"confirming {first_name}'s {grant['role']} role failed:"
                                 f" {confirmed.status_code} {confirmed.text[:400]}")
            roles.append(grant["role"])
        people[role] = Person(created["name"], roles, created["token"])
        # Kept so that a person can sign in to the console as them after the demo (0600).
        write_secret(settings.secrets, person_token_secret(role), created["token"])
    return people


def person_token_secret(role: str) -> str:
    """The secret file that keeps the demo's person of this role's API token."""
    return f"demo-{role.replace('_', '-')}-token"


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


async def admit_tasks(settings: Settings, task_ids: list[str],
                      decide: Callable[[str], dict[str, Any]]) -> list[str]:
    """Run each task's AdmissionWorkflow (the four questions), then the operator decides.

    The assessment is governance's own work; ``decide(task_id)`` is the operator's decision,
    which goes through the web API with their token (POST /api/tasks/TASK/admission).
    """
    from temporalio.common import WorkflowIDConflictPolicy

    from triloop.workflow_api import (
        ADMISSION_STATUS_QUERY,
        ADMISSION_WORKFLOW,
        GOVERNANCE_QUEUE,
        AdmissionInput,
        AdmissionResult,
        admission_workflow_id,
    )

    client = await connect(settings, identity=f"demo-governance@{socket.gethostname()}",
                           service="governance")

    async def assess(task_id: str) -> AdmissionResult:
        handle = await client.start_workflow(
            ADMISSION_WORKFLOW, AdmissionInput(task_id=task_id, requested_by="demo"),
            id=admission_workflow_id(task_id), task_queue=settings.task_queue(GOVERNANCE_QUEUE),
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        status: AdmissionResult = await handle.query(ADMISSION_STATUS_QUERY,
                                                     result_type=AdmissionResult)
        while status.status == "assessing":
            await asyncio.sleep(0.5)
            status = await handle.query(ADMISSION_STATUS_QUERY, result_type=AdmissionResult)
        return status

    lines = []
    for task_id, status in zip(task_ids, await asyncio.gather(*map(assess, task_ids)),
                               strict=True):
        reasons = status.reasons
        if status.status == "awaiting_decision":
            decided = await asyncio.to_thread(decide, task_id)
            state, reasons = decided["status"], decided["reasons"]
        else:
            state = status.status
        answers = ", ".join(reason.split(":")[0] for reason in reasons if ": ok" in reason)
        lines.append(f"{task_id[:12]}… {state}: {answers or '; '.join(reasons)}")
    return lines


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
    # A tiny model from random weights almost never reaches the goal, so a success rate of 0
    # in both arms tells the canary nothing; the shaped reward (about -1 to 1.3) does. The
    # canary judges reward alone, and the threshold version says so.
    "canary": {"min_samples_per_arm": 16, "regression_to_detect": 0.2,
               "reward_regression_to_detect": 0.2, "check_success_rate": False},
    "watch": {"min_samples": 16, "regression_to_detect": 0.2, "max_reward_regression": 0.1},
    # Named although it is the default: a rise in held-out reward must be at least half the
    # task's (goals reached), not shaping's (progress) or format's (valid moves).
    "attribution": {"min_task_share": 0.5},
}
