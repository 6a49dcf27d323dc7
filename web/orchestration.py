"""The web service's only way to reach the loops: Temporal, by the names in ``workflow_api``.

``Orchestrator`` connects lazily (the API serves reads while Temporal is down) as
``web@<host>`` and turns Temporal's errors into problems: a workflow that is not
running is a 409, a refused update or workflow is answered by its error's type
(``triloop.workflow_api.ErrorType``, never its text): 403 when the policy or a duty rule
refused the person, 422 when what they asked for cannot be stored, 503 when the policy
was unreachable, 409 otherwise. No answer in time is a 504 and an unreachable server a
503.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, TypeVar

from temporalio.client import (
    Client,
    RPCTimeoutOrCancelledError,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.exceptions import ApplicationError, FailureError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from triloop import search_attributes
from triloop.config import LoopName, Settings
from triloop.statuses import Gate
from triloop.temporal import connect, in_namespace
from triloop.workflow_api import (
    ADMISSION_DECIDE_UPDATE,
    EXECUTION_QUEUE,
    GOVERNANCE_QUEUE,
    GOVERNANCE_WRITE_WORKFLOW,
    LEARNING_QUEUE,
    MODEL_IMPORT_WORKFLOW,
    ROLLBACK_WORKFLOW,
    ROLLOUT_WORKFLOW,
    TASK_SET_REGISTRATION_WORKFLOW,
    TRAINING_RUN_WORKFLOW,
    AdmissionResult,
    DecisionRef,
    ErrorType,
    GateSummary,
    GovernanceWriteInput,
    GovernanceWriteResult,
    ModelImportInput,
    ModelImportResult,
    RollbackInput,
    RollbackResult,
    RolloutBatchInput,
    RunControl,
    TaskSetAdmissionResult,
    TrainingRunInput,
    admission_workflow_id,
    promotion_decision_update,
    task_set_admission_workflow_id,
)
from web.problems import ProblemError, conflict

T = TypeVar("T")
R = TypeVar("R")

# Production batches started for people (POST /api/episodes) have workflow ids with this prefix.
PRODUCTION_BATCH_PREFIX = "episodes-"


@dataclass(frozen=True)
class ImportProgress:
    """Where a model import's workflow is (``Orchestrator.model_import_progress``)."""

    status: Literal["running", "completed", "failed"]
    stage: str | None = None  # the activity's last heartbeat, while it runs
    checkpoint_id: str | None = None
    problem: str | None = None
    reasons: list[str] = field(default_factory=list)


def web_identity() -> str:
    """The Temporal identity of this web process."""
    return f"web@{socket.gethostname()}"


class Orchestrator:
    """Starts, signals and updates the loops' workflows for the web service."""

    def __init__(self, settings: Settings, *, timeout_s: float = 60.0) -> None:
        self._settings = settings
        self.timeout_s = timeout_s
        self._client: Client | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._lock = asyncio.Lock()

    async def client(self, loop: LoopName) -> Client:
        """A client in ``loop``'s namespace, connected on first use (again on a new loop).

        One connection with the web service's token serves all three namespaces.
        """
        running = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not running:
            try:
                self._client = await asyncio.wait_for(connect(
                    self._settings, identity=web_identity(), service="web", loop="learning"),
                    timeout=10)
            except (RuntimeError, OSError, TimeoutError) as exc:
                raise ProblemError(
                    503, "Temporal unavailable",
                    f"cannot reach Temporal at {self._settings.temporal_address}: {exc}",
                ) from exc
            self._client_loop = running
        return in_namespace(self._client, self._settings, loop)

    async def start_training_run(self, run: TrainingRunInput, workflow_id: str) -> None:
        """Start the learning loop's run workflow on its queue."""
        client = await self.client("learning")
        await self._call(client.start_workflow(
            TRAINING_RUN_WORKFLOW, run, id=workflow_id,
            task_queue=self._settings.task_queue(LEARNING_QUEUE),
            search_attributes=search_attributes.attributes(
                loop="learning", run_id=run.run_id, user=run.submitted_by),
        ), what=f"start training run {run.run_id}")

    async def start_model_import(self, request: ModelImportInput, workflow_id: str) -> None:
        """Start the learning loop's model import; an import of the name still running is a
        409 (the id is the name's)."""
        client = await self.client("learning")
        await self._call(client.start_workflow(
            MODEL_IMPORT_WORKFLOW, request, id=workflow_id,
            task_queue=self._settings.task_queue(LEARNING_QUEUE),
            search_attributes=search_attributes.attributes(
                loop="learning", user=request.requested_by),
        ), what=f"import model {request.name}")

    async def model_import_progress(self, workflow_id: str) -> ImportProgress | None:
        """The import's state (None: no such import): its stage, checkpoint, or problem."""
        client = await self.client("learning")
        handle = client.get_workflow_handle(workflow_id, result_type=ModelImportResult)
        what = f"read model import {workflow_id}"
        description = await self._call(_described(handle), what=what)
        if description is None:
            return None
        if description.status == WorkflowExecutionStatus.RUNNING:
            return ImportProgress("running", stage=await _stage(client, description))
        try:
            result: ModelImportResult = await self._call(handle.result(), what=what)
        except ProblemError as exc:
            cause = exc.__cause__
            typed = _first_application_error(cause.cause if isinstance(
                cause, WorkflowFailureError) else cause)
            problem = typed.message if typed is not None else exc.detail
            reasons = [str(r) for r in (typed.details[0] if typed is not None and typed.details
                                        and isinstance(typed.details[0], list) else [])]
            return ImportProgress("failed", problem=problem, reasons=reasons)
        return ImportProgress("completed", checkpoint_id=result.checkpoint_id)

    async def signal_run(self, workflow_id: str, signal: str, control: RunControl) -> None:
        """Send pause/resume/cancel to a run's workflow."""
        client = await self.client("learning")
        handle = client.get_workflow_handle(workflow_id)
        await self._call(handle.signal(signal, control), what=f"{signal} run {workflow_id}")

    async def promotion_update(
        self, workflow_id: str, gate: Gate, decision: DecisionRef
    ) -> GateSummary:
        """Send a person's decision at ``gate`` to the promotion workflow; its gate result."""
        client = await self.client("governance")
        handle = client.get_workflow_handle(workflow_id)
        update = promotion_decision_update(gate)
        result: GateSummary = await self._call(
            handle.execute_update(update, decision, result_type=GateSummary,
                                  rpc_timeout=self._rpc_timeout()),
            # People's words: the decision, not the Temporal workflow's id.
            what=f"the {gate} decision",
        )
        return result

    async def admission_update(self, task_id: str, decision: DecisionRef) -> AdmissionResult:
        """Send an operator's recorded decision to the task's admission workflow."""
        client = await self.client("governance")
        handle = client.get_workflow_handle(admission_workflow_id(task_id))
        result: AdmissionResult = await self._call(handle.execute_update(
            ADMISSION_DECIDE_UPDATE, decision, result_type=AdmissionResult,
            rpc_timeout=self._rpc_timeout()), what=f"decide admission of task {task_id}")
        return result

    async def task_set_admission_update(
        self, task_set_id: str, decision: DecisionRef
    ) -> TaskSetAdmissionResult:
        """Send an operator's recorded decision to the task set's admission workflow."""
        client = await self.client("governance")
        handle = client.get_workflow_handle(task_set_admission_workflow_id(task_set_id))
        result: TaskSetAdmissionResult = await self._call(handle.execute_update(
            ADMISSION_DECIDE_UPDATE, decision, result_type=TaskSetAdmissionResult,
            rpc_timeout=self._rpc_timeout()), what=f"decide admission of task set {task_set_id}")
        return result

    async def _run_governance(self, workflow: str, request: Any, result_type: type[R], *,
                              workflow_id: str, user: str | None, what: str) -> R:
        """Run one of governance's workflows to completion on its queue and return its result."""
        client = await self.client("governance")
        result: R = await self._call(client.execute_workflow(
            workflow, request, id=workflow_id,
            task_queue=self._settings.task_queue(GOVERNANCE_QUEUE), result_type=result_type,
            search_attributes=search_attributes.attributes(loop="governance", user=user),
            execution_timeout=timedelta(seconds=self.timeout_s),
        ), what=what)
        return result

    async def rollback(self, request: RollbackInput, workflow_id: str,
                       user: str | None = None) -> RollbackResult:
        """Run governance's rollback workflow to completion and return where the alias points."""
        return await self._run_governance(ROLLBACK_WORKFLOW, request, RollbackResult,
                                          workflow_id=workflow_id, user=user,
                                          what=f"roll back {request.alias}")

    async def governance_write(self, request: GovernanceWriteInput, workflow_id: str,
                               user: str | None = None) -> GovernanceWriteResult:
        """Have governance carry out a person's recorded write and return what it stored."""
        return await self._run_governance(GOVERNANCE_WRITE_WORKFLOW, request,
                                          GovernanceWriteResult, workflow_id=workflow_id,
                                          user=user, what=f"{request.kind} {request.subject}")

    async def register_task_set(self, request: GovernanceWriteInput, workflow_id: str,
                                user: str | None = None) -> GovernanceWriteResult:
        """Have governance describe, write and start admitting a person's task set."""
        return await self._run_governance(TASK_SET_REGISTRATION_WORKFLOW, request,
                                          GovernanceWriteResult, workflow_id=workflow_id,
                                          user=user, what=f"task set {request.subject}")

    async def start_episodes(self, batch: RolloutBatchInput, workflow_id: str) -> None:
        """Start a batch of production episodes on the execution loop's queue."""
        client = await self.client("execution")
        await self._call(client.start_workflow(
            ROLLOUT_WORKFLOW, batch, id=workflow_id,
            task_queue=self._settings.task_queue(EXECUTION_QUEUE),
            search_attributes=search_attributes.attributes(loop="execution"),
        ), what=f"start episode batch {batch.batch_id}")

    async def production_batches_in_flight(self) -> int:
        """Production episode batches still running on this deployment's execution queue.

        Read from Temporal's visibility store, which may lag a start by a moment: the bound
        it serves is a guard against a pile-up, not an exact count.
        """
        client = await self.client("execution")
        query = (f'WorkflowType = "{ROLLOUT_WORKFLOW}" AND ExecutionStatus = "Running" AND '
                 f'TaskQueue = "{self._settings.task_queue(EXECUTION_QUEUE)}" AND '
                 f'WorkflowId STARTS_WITH "{PRODUCTION_BATCH_PREFIX}"')
        counted = await self._call(client.count_workflows(query),
                                   what="count production batches in flight")
        return int(counted.count)

    def _rpc_timeout(self) -> timedelta:
        return timedelta(seconds=self.timeout_s)

    async def _call(self, call: Awaitable[T], *, what: str) -> T:
        try:
            return await asyncio.wait_for(call, timeout=self.timeout_s + 5)
        except (TimeoutError, RPCTimeoutOrCancelledError) as exc:
            raise ProblemError(
                504, "Loop did not answer",
                f"{what}: no answer within {self.timeout_s:g}s; is the loop's worker running?",
            ) from exc
        except WorkflowAlreadyStartedError as exc:
            raise conflict(f"{what}: a workflow with that id already exists") from exc
        except (WorkflowUpdateFailedError, WorkflowFailureError) as exc:
            raise refused(what, exc.cause) from exc
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                raise conflict(f"{what}: the workflow is not running ({exc.message})") from exc
            if exc.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
                raise ProblemError(503, "Temporal unavailable", f"{what}: {exc.message}") from exc
            raise conflict(f"{what}: Temporal refused the call ({exc.message})") from exc


# The answer to a refusal, by its error's type; any other refusal is a 409.
REFUSAL_STATUS: dict[str, tuple[int, str]] = {
    ErrorType.POLICY_DENIED: (403, "Forbidden"),
    ErrorType.DECISION_REFUSED: (403, "Forbidden"),
    ErrorType.INVALID_REQUEST: (422, "Invalid input"),
    ErrorType.POLICY_UNAVAILABLE: (503, "Policy unavailable"),
}


def refused(what: str, cause: BaseException) -> ProblemError:
    """The workflow refused or failed: the answer its error's type calls for (``ErrorType``)."""
    typed = _typed_cause(cause)
    message = _refusal_reason(cause)
    if typed is None or typed.type not in REFUSAL_STATUS:
        return conflict(f"{what}: refused by the workflow: {message}")
    status, title = REFUSAL_STATUS[typed.type]
    if typed.type == ErrorType.INVALID_REQUEST:  # what the person asked cannot be stored
        details = typed.details
        reasons = details[0] if details and isinstance(details[0], list) else [typed.message]
        return ProblemError(status, title, f"{what}: governance refused: {typed.message}",
                            reasons=[str(r) for r in reasons])
    return ProblemError(status, title, f"{what}: governance refused: {message}")


def _typed_cause(error: BaseException) -> ApplicationError | None:
    """The first error in the chain whose type calls for an answer other than 409."""
    current: BaseException | None = error
    while current is not None:
        if isinstance(current, ApplicationError) and current.type in REFUSAL_STATUS:
            return current
        current = current.__cause__
    return None


def _refusal_reason(error: BaseException) -> str:
    """The refusal in the words of whoever refused, once: the innermost application error's
    message. A workflow passes its activity's refusal on as ``refused: <it>`` with the
    activity's failure as its cause, so the whole chain says the same thing twice."""
    reason = None
    current: BaseException | None = error
    while current is not None:
        if isinstance(current, ApplicationError) and current.message:
            reason = current.message
        current = current.__cause__
    return reason or _root_message(error)


def _root_message(error: BaseException) -> str:
    parts: list[str] = []
    current: BaseException | None = error
    while current is not None and len(parts) < 4:
        text = current.message if isinstance(current, FailureError) else str(current)
        if text and text not in parts:
            parts.append(text)
        current = current.__cause__
    return ": ".join(parts) or "the workflow gave no reason"


async def _described(handle: WorkflowHandle[object, object]) -> WorkflowExecutionDescription | None:
    try:
        return await handle.describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return None
        raise


async def _stage(client: Client, description: WorkflowExecutionDescription) -> str | None:
    """The stage the workflow's running activity last heartbeat ({"stage": ...})."""
    for pending in description.raw_description.pending_activities:
        payloads = list(pending.heartbeat_details.payloads)
        if payloads:
            details = await client.data_converter.decode(payloads)
            if details and isinstance(details[0], dict) and "stage" in details[0]:
                return str(details[0]["stage"])
        return "waiting for the learning worker" if pending.attempt <= 1 else "retrying"
    return None


def _first_application_error(error: BaseException | None) -> ApplicationError | None:
    current = error
    while current is not None:
        if isinstance(current, ApplicationError):
            return current
        current = current.__cause__
    return None
