"""Temporal for tests: queues of a test's own (with their Nexus endpoints) and the loops'
Nexus handlers, built as each loop's worker builds them.

The test plays every service, so it holds every service's token; each client still works
in one loop's namespace with that loop's token, as the services do.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

from temporalio import workflow
from temporalio.client import Client, WorkflowHandle

from triloop.config import LoopName, ServiceName, Settings
from triloop.devstack.temporal_server import provision
from triloop.nexus_caller import NexusCallerCheck
from triloop.policy import Actor
from triloop.temporal import connect
from triloop.wiring import build_authorizer
from triloop.workflow_api import ROLLOUT_WORKFLOW, RolloutBatchInput, RolloutBatchResult


def own_queues(settings: Settings, tag: str = "", **update: Any) -> Settings:
    """Settings with task queues (and Nexus endpoints) of this test's own."""
    prefix = f"{settings.task_queue_prefix}{tag}{uuid.uuid4().hex[:6]}-"
    own = settings.model_copy(update={"task_queue_prefix": prefix, **update})
    provision_endpoints(own)
    return own


def provision_endpoints(settings: Settings) -> None:
    """Create the endpoints of ``settings``' queue prefix, from sync or async code alike."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            provision(settings)
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


async def loop_client(settings: Settings, loop: LoopName, identity: str,
                      *, service: ServiceName | None = None) -> Client:
    """A client in ``loop``'s namespace with ``service``'s token (default: the loop's own)."""
    return await connect(settings, identity=identity, service=service or loop, loop=loop)


async def admin_client(settings: Settings, loop: LoopName) -> Client:
    """A client in ``loop``'s namespace with the operator's admin token (no service holds it):
    what a test uses to end a workflow, which no service token may do in governance."""
    from triloop.devstack.temporal_keys import ADMIN
    from triloop.temporal import DATA_CONVERTER

    return await Client.connect(settings.temporal_address,
                                namespace=settings.temporal_namespace(loop),
                                api_key=settings.temporal_credential(ADMIN), tls=False,
                                identity="triloop-test-operator", data_converter=DATA_CONVERTER)


async def terminate_as_operator(settings: Settings, handle: WorkflowHandle[Any, Any],
                                reason: str = "test over",
                                loop: LoopName = "governance") -> None:
    """End a test's workflow as the operator would: no service token may end a governance
    workflow (the server's authorizer refuses it)."""
    operator = await admin_client(settings, loop)
    await operator.get_workflow_handle(handle.id).terminate(reason)


def execution_nexus(settings: Settings) -> Any:
    """The execution loop's Nexus handlers, checking callers with execution's OPA token."""
    from execution_loop.nexus_handlers import ExecutionNexusHandlers
    from triloop.db import role_engine

    return ExecutionNexusHandlers(NexusCallerCheck(
        settings, server=Actor("execution"), authorizer=build_authorizer(settings, "execution")),
        role_engine(settings, "execution"))


def governance_nexus(settings: Settings) -> Any:
    """Governance's Nexus handler, checking callers with governance's OPA token."""
    from governance_loop.nexus_handlers import GovernanceNexusHandlers

    return GovernanceNexusHandlers(NexusCallerCheck(
        settings, server=Actor("governance"), authorizer=build_authorizer(settings, "governance")))


@workflow.defn(name=ROLLOUT_WORKFLOW)
class InstantRollout:
    """Stands in for the rollout workflow: answers at once."""

    @workflow.run
    async def run(self, batch: RolloutBatchInput) -> RolloutBatchResult:
        return RolloutBatchResult(batch_id=batch.batch_id)
