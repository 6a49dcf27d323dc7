"""What the governance workflows share: the execution loop's Nexus client, refusals.

Deterministic code only, like every module of this package.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from triloop.nexus_api import ExecutionService, endpoint_for
    from triloop.workflow_api import ErrorType

def execution_loop() -> workflow.NexusClient[ExecutionService]:
    """The execution loop's Nexus operations: governance's only way to ask it for work."""
    return workflow.create_nexus_client(
        service=ExecutionService, endpoint=endpoint_for(workflow.info().task_queue, "execution"))


def failure_chain(error: BaseException) -> str:
    """A failure and its causes in one line: "operation failed: handler refused: why"."""
    parts: list[str] = []
    current: BaseException | None = error
    while current is not None and len(parts) < 6:
        parts.append(str(current))
        current = current.__cause__ or getattr(current, "cause", None)
    return ": ".join(parts)


# What a refusal of a person's decision says to the caller: OPA's own answers keep their
# type; any other rule of the loop (duties, roles, the recorded row) refused the decision.
_KEPT_TYPES = frozenset({ErrorType.POLICY_DENIED, ErrorType.POLICY_UNAVAILABLE})


def refusal(error: ActivityError) -> ApplicationError:
    """An update's failure that tells the person why the activity refused their decision.

    Its ``type`` says what refused (``ErrorType``), so the web service answers by type.
    """
    cause = error.cause
    message = cause.message if isinstance(cause, ApplicationError) else str(cause or error)
    kind = cause.type if isinstance(cause, ApplicationError) else None
    typed = kind if kind in _KEPT_TYPES else ErrorType.DECISION_REFUSED
    return ApplicationError(f"refused: {message}", type=typed, non_retryable=True)
