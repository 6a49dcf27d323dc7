"""The Temporal server itself refuses what no service's credentials may do.

The session's server is the real one that ``dev up`` runs (see the conftest): JWT
authorization on its public frontend with triloop's authorizer in front of the default
one (``tools/temporal-server``), and the server's own certificate asked for on every other
port. A process holding the learning worker's token tries every way of moving a governance
workflow; the server refuses each one. Between loops, only Nexus operations pass, and the
serving loop's handler asks OPA whether the calling loop may ask for that purpose.
"""

from __future__ import annotations

import socket
import ssl
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml
from sqlalchemy import Engine, text
from temporalio import workflow
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.operatorservice.v1 import ListNexusEndpointsRequest
from temporalio.api.workflowservice.v1 import (
    DeleteWorkflowExecutionRequest,
    ResetWorkflowExecutionRequest,
)
from temporalio.client import Client, TLSConfig, WorkflowExecutionStatus, WorkflowHandle
from temporalio.exceptions import NexusOperationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from tests.factories import make_task
from tests.temporal_helpers import (
    InstantRollout,
    admin_client,
    execution_nexus,
    loop_client,
    own_queues,
)
from triloop.config import ServiceName, Settings
from triloop.devstack.processes import ServiceProcess
from triloop.devstack.temporal_keys import mint_token
from triloop.devstack.temporal_server import internode_secrets
from triloop.devstack.temporal_tls import (
    CA_FILE,
    CERT_FILE,
    INTERNODE_SERVER_NAME,
    KEY_FILE,
)
from triloop.nexus_api import ExecutionService, endpoint_for
from triloop.temporal import connect
from triloop.workflow_api import (
    EXECUTION_QUEUE,
    GOVERNANCE_QUEUE,
    LEARNING_QUEUE,
    RolloutBatchInput,
    RolloutItem,
)

pytestmark = pytest.mark.integration


@workflow.defn(name="GovernanceTarget")
class GovernanceTarget:
    """A governance workflow that counts what reaches it."""

    def __init__(self) -> None:
        self.touched: list[str] = []
        self.done = False

    @workflow.run
    async def run(self) -> list[str]:
        await workflow.wait_condition(lambda: self.done)
        return self.touched

    @workflow.signal(name="poke")
    def poke(self) -> None:
        self.touched.append("signal")

    @workflow.update(name="decide")
    def decide(self, decision: str) -> str:
        self.touched.append(f"update {decision}")
        return decision

    @workflow.signal(name="finish")
    def finish(self) -> None:
        self.done = True


@workflow.defn(name="AskExecution")
class AskExecution:
    """A learning workflow asking execution for a batch of some purpose."""

    @workflow.run
    async def run(self, purpose: str, task_id: str) -> str:
        execution = workflow.create_nexus_client(
            service=ExecutionService,
            endpoint=endpoint_for(workflow.info().task_queue, "execution"))
        # One planned episode: a batch that plans none is refused (0021).
        result = await execution.execute_operation(
            ExecutionService.run_rollouts,
            RolloutBatchInput(batch_id=f"ask-{purpose}-{workflow.info().run_id[:8]}",
                              purpose=purpose, items=[RolloutItem(task_id, 0, 1)]),
            schedule_to_close_timeout=timedelta(seconds=60))
        return result.batch_id


@workflow.defn(name="AskExecutionAsGovernance")
class AskExecutionAsGovernance:
    """A learning workflow that writes its own ``Nexus-Link``, naming governance as the
    caller of an eval batch (which only governance may ask for)."""

    @workflow.run
    async def run(self, link: str) -> str:
        execution = workflow.create_nexus_client(
            service=ExecutionService,
            endpoint=endpoint_for(workflow.info().task_queue, "execution"))
        result = await execution.execute_operation(
            ExecutionService.run_rollouts,
            RolloutBatchInput(batch_id=f"forged-{workflow.info().run_id[:8]}", purpose="eval",
                              items=[]),
            schedule_to_close_timeout=timedelta(seconds=60), headers={"Nexus-Link": link})
        return result.batch_id


async def test_learning_credentials_cannot_move_a_governance_workflow(settings: Settings) -> None:
    own = own_queues(settings, "authz-")
    governance = await loop_client(own, "governance", "governance-test")
    queue = own.task_queue(GOVERNANCE_QUEUE)
    async with Worker(governance, task_queue=queue, workflows=[GovernanceTarget],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        target = await governance.start_workflow(
            GovernanceTarget.run, id=f"target-{uuid.uuid4().hex[:8]}", task_queue=queue)
        # The learning worker's own token, aimed at governance's namespace.
        intruder = await connect(own, identity="learning-intruder", service="learning",
                                 loop="governance")
        handle = intruder.get_workflow_handle(target.id)
        namespace = own.temporal_namespace("governance")
        attempts: dict[str, Callable[[], Awaitable[Any]]] = {
            "update": lambda: handle.execute_update("decide", "promote"),
            "signal": lambda: handle.signal("poke"),
            "start": lambda: intruder.start_workflow(
                "GovernanceTarget", id=f"forged-{uuid.uuid4().hex[:8]}", task_queue=queue),
            "signal-with-start": lambda: intruder.start_workflow(
                "GovernanceTarget", id=target.id, task_queue=queue, start_signal="poke"),
            "terminate": lambda: handle.terminate("learning wants this gone"),
            "reset": lambda: intruder.workflow_service.reset_workflow_execution(
                ResetWorkflowExecutionRequest(
                    namespace=namespace, reason="learning rewinds governance",
                    workflow_execution=WorkflowExecution(workflow_id=target.id),
                    workflow_task_finish_event_id=3, request_id=str(uuid.uuid4()))),
        }
        for what, attempt in attempts.items():
            with pytest.raises(RPCError) as refused:
                await attempt()
            assert refused.value.status == RPCStatusCode.PERMISSION_DENIED, what

        # Nothing reached the workflow; its own loop still drives it.
        await target.signal("finish")
        assert await target.result() == []


async def test_a_token_the_server_did_not_sign_or_no_token_is_refused(
    settings: Settings,
) -> None:
    from cryptography.hazmat.primitives.asymmetric import rsa

    namespace = settings.temporal_namespace("learning")
    forger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    forged = mint_token(forger, subject="triloop-learning", grants=[f"{namespace}:write"])
    # A forged signature fails at the first call (connecting); no token at the first write.
    with pytest.raises(RuntimeError, match="PermissionDenied"):
        await Client.connect(settings.temporal_address, namespace=namespace, api_key=forged,
                             tls=False)
    anonymous = await Client.connect(settings.temporal_address, namespace=namespace, tls=False)
    with pytest.raises(RPCError) as refused:
        await anonymous.start_workflow("Anything", id=f"x-{uuid.uuid4().hex[:8]}",
                                       task_queue=settings.task_queue(LEARNING_QUEUE))
    assert refused.value.status == RPCStatusCode.PERMISSION_DENIED


async def test_execution_serves_learning_training_batches_only(
    settings: Settings, owner_engine: Engine,
) -> None:
    own = own_queues(settings, "nexus-")
    learning = await loop_client(own, "learning", "learning-test")
    execution = await loop_client(own, "execution", "execution-test")
    async with Worker(learning, task_queue=own.task_queue(LEARNING_QUEUE),
                      workflows=[AskExecution], workflow_runner=UnsandboxedWorkflowRunner()), \
            Worker(execution, task_queue=own.task_queue(EXECUTION_QUEUE),
                   workflows=[InstantRollout], workflow_runner=UnsandboxedWorkflowRunner(),
                   nexus_service_handlers=[execution_nexus(own)]):
        allowed = await learning.execute_workflow(
            AskExecution.run, args=["training", make_task(owner_engine)],
            id=f"ask-{uuid.uuid4().hex[:8]}",
            task_queue=own.task_queue(LEARNING_QUEUE))
        assert allowed.startswith("ask-training-")
        with pytest.raises(Exception) as refused:
            await learning.execute_workflow(
                AskExecution.run, args=["eval", make_task(owner_engine)],
                id=f"ask-{uuid.uuid4().hex[:8]}",
                task_queue=own.task_queue(LEARNING_QUEUE))
    failure = refused.value.__cause__
    assert isinstance(failure, NexusOperationError)
    assert "execution refuses run_rollouts (eval) to learning" in str(failure.__cause__)
    with owner_engine.connect() as conn:
        denied = conn.execute(text(
            "SELECT actor->>'service', resource->'attrs'->>'caller', db_role FROM audit_event "
            "WHERE action = 'serve' AND decision = 'deny' AND resource->>'kind' = "
            "'nexus_operation' AND resource->'attrs'->>'purpose' = 'eval' "
            "AND resource->'attrs'->>'batch_id' LIKE 'ask-eval-%'")).all()
    assert [tuple(row) for row in denied] == [("execution", "learning", "triloop_execution")]


# ---- every port but the public frontend's asks for the server's own certificate ----

def _server_ports(stack_dir: Path) -> dict[str, int]:
    """Every port the session server was configured with (``<service> <kind>``), read back
    from the config ``dev up`` wrote for it."""
    config = yaml.safe_load((stack_dir / "temporal" / "config.yaml").read_text())
    ports = {f"{name} {kind}": port for name, spec in config["services"].items()
             for kind, port in spec["rpc"].items() if kind.endswith("Port")}
    metrics = (config["global"].get("metrics") or {}).get("prometheus", {})
    if "listenAddress" in metrics:
        ports["metrics"] = int(metrics["listenAddress"].rsplit(":", 1)[1])
    return ports


def _listening(pid: int) -> set[int]:
    return {c.laddr.port for c in psutil.Process(pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN}


def _tls_context(secrets: Path, *, with_certificate: bool) -> ssl.SSLContext:
    """A client that trusts the server's CA, showing the server's certificate or none.

    TLS 1.2, so that a missing client certificate fails the handshake itself (in 1.3 the
    server's alert arrives after the client's side of the handshake is done).
    """
    context = ssl.create_default_context(cafile=str(secrets / CA_FILE))
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    if with_certificate:
        context.load_cert_chain(secrets / CERT_FILE, secrets / KEY_FILE)
    return context


def _handshake(port: int, context: ssl.SSLContext) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=INTERNODE_SERVER_NAME):
        pass


def test_every_port_but_the_public_frontend_wants_the_servers_certificate(
    temporal_server: tuple[ServiceProcess, str], stack_dir: Path,
) -> None:
    proc, address = temporal_server
    ports = _server_ports(stack_dir)
    public = ports["frontend grpcPort"]
    assert int(address.rsplit(":", 1)[1]) == public
    guarded = set(ports.values()) - {public}
    # The server listens on these ports and no other (no metrics, no pprof).
    assert _listening(proc.pid) == set(ports.values())
    secrets = internode_secrets(stack_dir / "temporal")
    anyone, server = (_tls_context(secrets, with_certificate=c) for c in (False, True))
    for port in sorted(guarded):
        with pytest.raises((ssl.SSLError, ConnectionError)):
            _handshake(port, anyone)
        _handshake(port, server)  # the same port lets the server's own processes in


def _admin_calls(client: Client) -> dict[str, Callable[[], Awaitable[Any]]]:
    """What the internal frontend would let anyone do: it makes every caller a system admin."""
    return {
        "list": lambda: client.list_workflows().fetch_next_page(),
        "start": lambda: client.start_workflow(
            "PromotionWorkflow", id=f"x-{uuid.uuid4().hex[:8]}", task_queue="any"),
        "terminate": lambda: client.get_workflow_handle("any").terminate("gone"),
        "nexus endpoints": lambda: client.operator_service.list_nexus_endpoints(
            ListNexusEndpointsRequest()),
    }


async def test_the_internal_frontend_gives_nothing_without_the_certificate(
    settings: Settings, stack_dir: Path,
) -> None:
    """No token, no certificate: not one call reaches the internal frontend, whose claim
    mapper would make its caller a system admin."""
    ports = _server_ports(stack_dir)
    secrets = internode_secrets(stack_dir / "temporal")
    target = f"127.0.0.1:{ports['internal-frontend grpcPort']}"
    namespace = settings.temporal_namespace("governance")
    def trusting() -> TLSConfig:  # trusts the server's CA, shows no certificate
        return TLSConfig(server_root_ca_cert=(secrets / CA_FILE).read_bytes(),
                         domain=INTERNODE_SERVER_NAME)

    for tls in (lambda: False, trusting):
        with pytest.raises(RuntimeError):
            await Client.connect(target, namespace=namespace, tls=tls())
        client = await Client.connect(target, namespace=namespace, tls=tls(), lazy=True)
        attempts = _admin_calls(client)
        for what, attempt in attempts.items():
            with pytest.raises((RuntimeError, RPCError)):
                await attempt()
            assert what  # each one failed on its own
    # With the server's certificate the same port answers (it is the server's own door).
    server = await Client.connect(target, namespace=namespace, tls=TLSConfig(
        server_root_ca_cert=(secrets / CA_FILE).read_bytes(), domain=INTERNODE_SERVER_NAME,
        client_cert=(secrets / CERT_FILE).read_bytes(),
        client_private_key=(secrets / KEY_FILE).read_bytes()))
    await server.operator_service.list_nexus_endpoints(ListNexusEndpointsRequest())


def _plain_http_refused(url: str, headers: dict[str, str]) -> bool:
    """A plain HTTP request gets Go's answer of a TLS port ("Client sent an HTTP request to
    an HTTPS server"), or the server has already closed the connection when the client
    reads it; never an answer of the Nexus handler."""
    try:
        answer = httpx.post(url, headers=headers, json={})
    except httpx.TransportError:
        return True
    return answer.status_code == 400 and "HTTP request to an HTTPS server" in answer.text


@pytest.mark.parametrize("service", ["execution", "learning", "governance", "web"])
def test_no_service_token_reaches_the_nexus_http_api(
    settings: Settings, stack_dir: Path, service: ServiceName,
) -> None:
    """A hand-written ``Nexus-Link`` needs the Nexus HTTP API; no service token gets there."""
    ports = _server_ports(stack_dir)
    secrets = internode_secrets(stack_dir / "temporal")
    token = settings.temporal_credential(service)
    path = "/nexus/endpoints/any/services/triloop.execution/run_rollouts"
    link = f"<temporal:///namespaces/{settings.temporal_namespace('governance')}/workflows/w/r>"
    headers = {"Authorization": f"Bearer {token}", "Nexus-Link": f'{link}; type="x"'}
    for port in (ports["frontend httpPort"], ports["internal-frontend httpPort"]):
        assert _plain_http_refused(f"http://127.0.0.1:{port}{path}", headers)
        with pytest.raises(httpx.ConnectError):  # the handshake wants the server's certificate
            httpx.post(f"https://127.0.0.1:{port}{path}", headers=headers, json={},
                       verify=_tls_context(secrets, with_certificate=False))


# ---- the narrower authorizer: no service rewrites a governance workflow ----

FIRST_TASK_COMPLETED = 4  # started, task scheduled, task started, task completed


async def _first_task_done(handle: WorkflowHandle[Any, Any]) -> None:
    """Wait until the workflow's first task completed: a valid reset point exists."""
    from temporalio.api.enums.v1 import EventType

    from tests.factories_governance import wait_for

    async def done() -> bool:
        return EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED in [
            e.event_type async for e in handle.fetch_history_events()]

    await wait_for(done, timeout=60, what=f"{handle.id}'s first workflow task")


def _rewrites(client: Client, settings: Settings,
              handle: WorkflowHandle[Any, Any]) -> dict[str, Callable[[], Awaitable[Any]]]:
    """Every way of ending or rewinding ``handle``'s workflow from outside it."""
    namespace = settings.temporal_namespace("governance")
    execution = WorkflowExecution(workflow_id=handle.id)
    return {
        "reset": lambda: client.workflow_service.reset_workflow_execution(
            ResetWorkflowExecutionRequest(
                namespace=namespace, reason="rewind the gate", workflow_execution=execution,
                workflow_task_finish_event_id=FIRST_TASK_COMPLETED, request_id=str(uuid.uuid4()))),
        "terminate": lambda: client.get_workflow_handle(handle.id).terminate("gone"),
        "cancel": lambda: client.get_workflow_handle(handle.id).cancel(),
        "delete": lambda: client.workflow_service.delete_workflow_execution(
            DeleteWorkflowExecutionRequest(namespace=namespace, workflow_execution=execution)),
    }


async def _refused(attempt: Callable[[], Awaitable[Any]], what: str, rule: str | None) -> None:
    with pytest.raises(RPCError) as refused:
        await attempt()
    assert refused.value.status == RPCStatusCode.PERMISSION_DENIED, what
    if rule is not None:  # triloop's own rule refused it, and says which and why
        assert f"triloop rule {rule}:" in str(refused.value), (what, str(refused.value))


@pytest.mark.parametrize(("service", "rule"), [
    ("web", "governance-history"), ("governance", "governance-history"),
    # learning and execution hold no write in governance: the default authorizer refuses.
    ("learning", None), ("execution", None),
])
async def test_no_service_token_ends_or_rewinds_a_governance_workflow(
    settings: Settings, service: ServiceName, rule: str | None,
) -> None:
    own = own_queues(settings, "rewind-")
    governance = await loop_client(own, "governance", "governance-test")
    queue = own.task_queue(GOVERNANCE_QUEUE)
    async with Worker(governance, task_queue=queue, workflows=[GovernanceTarget],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        target = await governance.start_workflow(
            GovernanceTarget.run, id=f"target-{uuid.uuid4().hex[:8]}", task_queue=queue)
        await _first_task_done(target)
        intruder = await loop_client(own, "governance", f"{service}-intruder", service=service)
        for what, attempt in _rewrites(intruder, own, target).items():
            await _refused(attempt, f"{service} {what}", rule)
        # Still running, untouched; the operator's admin token may still end it.
        assert (await target.describe()).status is not None
        await target.signal("finish")
        assert await target.result() == []


async def test_the_web_token_writes_only_starts_signals_and_updates(settings: Settings) -> None:
    own = own_queues(settings, "web-")
    governance = await loop_client(own, "governance", "governance-test")
    queue = own.task_queue(GOVERNANCE_QUEUE)
    async with Worker(governance, task_queue=queue, workflows=[GovernanceTarget],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        web = await loop_client(own, "governance", "web-test", service="web")
        started = await web.start_workflow(
            "GovernanceTarget", id=f"target-{uuid.uuid4().hex[:8]}", task_queue=queue)
        await started.signal("poke")
        assert await started.execute_update("decide", "promote") == "promote"
        # Outside governance too, the web token ends nothing: only its named writes pass.
        learning = await loop_client(own, "learning", "web-test", service="web")
        await _refused(lambda: learning.get_workflow_handle("any-run").terminate("gone"),
                       "web terminates a learning run", "web-writes")
        await started.signal("finish")
        assert await started.result() == ["signal", "update promote"]


async def test_the_admin_token_still_ends_a_governance_workflow(settings: Settings) -> None:
    own = own_queues(settings, "admin-")
    governance = await loop_client(own, "governance", "governance-test")
    queue = own.task_queue(GOVERNANCE_QUEUE)
    async with Worker(governance, task_queue=queue, workflows=[GovernanceTarget],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        target = await governance.start_workflow(
            GovernanceTarget.run, id=f"target-{uuid.uuid4().hex[:8]}", task_queue=queue)
        await _first_task_done(target)
        operator = await admin_client(own, "governance")
        rewound = await _rewrites(operator, own, target)["reset"]()
        assert rewound.run_id != target.first_execution_run_id
        await operator.get_workflow_handle(target.id).terminate("the operator ends it")
        described = await operator.get_workflow_handle(target.id).describe()
        assert described.run_id == rewound.run_id
        assert described.status == WorkflowExecutionStatus.TERMINATED


async def test_a_workflow_cannot_write_the_nexus_link_its_handler_reads(
    settings: Settings, owner_engine: Engine,
) -> None:
    """The server refuses the scheduling command itself: the link stays the server's."""
    from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause

    from tests.factories_governance import wait_for
    from tests.temporal_helpers import terminate_as_operator

    own = own_queues(settings, "link-")
    learning = await loop_client(own, "learning", "learning-test")
    execution = await loop_client(own, "execution", "execution-test")
    governance = own.temporal_namespace("governance")
    forged = (f"<temporal:///namespaces/{governance}/workflows/promotion-x/run-x/history"
              '?eventID=1>; type="temporal.api.common.v1.Link.WorkflowEvent"')
    async with Worker(learning, task_queue=own.task_queue(LEARNING_QUEUE),
                      workflows=[AskExecutionAsGovernance],
                      workflow_runner=UnsandboxedWorkflowRunner()), \
            Worker(execution, task_queue=own.task_queue(EXECUTION_QUEUE),
                   workflows=[InstantRollout], workflow_runner=UnsandboxedWorkflowRunner(),
                   nexus_service_handlers=[execution_nexus(own)]):
        async def refusal(handle: Any) -> str | None:
            async for event in handle.fetch_history_events():
                if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                    attrs = event.workflow_task_failed_event_attributes
                    assert attrs.cause == WorkflowTaskFailedCause.\
                        WORKFLOW_TASK_FAILED_CAUSE_BAD_SCHEDULE_NEXUS_OPERATION_ATTRIBUTES
                    return str(attrs.failure.message)
            return None

        while True:
            handle = await learning.start_workflow(
                AskExecutionAsGovernance.run, forged, id=f"forge-{uuid.uuid4().hex[:8]}",
                task_queue=own.task_queue(LEARNING_QUEUE))
            message = await wait_for(lambda h=handle: refusal(h), timeout=60,
                                     what="the server to refuse the forged Nexus-Link")
            if "not found" not in message:
                break
            # The history service learns of the endpoint this test just made by a background
            # long poll; until then it refuses the endpoint's name before it reads any header.
            # Only the first refusal is written to a history, so start a fresh workflow.
            await terminate_as_operator(own, handle, loop="learning")
        assert "disallowed header key" in message and "Nexus-Link" in message
        await terminate_as_operator(own, handle, loop="learning")
    with owner_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM rollout_batch WHERE id LIKE 'forged-%'"
                                 )).scalar_one() == 0
