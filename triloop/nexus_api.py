"""The Nexus operations one loop offers another: the only way a loop calls another loop.

Each loop runs in its own Temporal namespace and its token writes there only, so no loop
can start, signal, update or reset another loop's workflows. What a loop needs from
another it asks for through that loop's Nexus endpoint; the other loop's worker then
carries the work out under its own identity, after asking OPA whether the calling loop may
ask for it. The caller is known from the link the Temporal server attaches to every Nexus
request (the calling workflow's namespace), never from the request's payload.

- ``execution``: ``run_rollouts`` (learning: training batches; governance: eval, shadow,
  canary and probe batches), ``probe_admission`` and ``describe_tasks`` (governance: the
  content digests and tags of a task set's tasks, at registration).
- ``governance``: ``propose_candidate`` (learning hands over a checkpoint it proposed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

import nexusrpc

from triloop.workflow_api import (
    EXECUTION_QUEUE,
    GOVERNANCE_QUEUE,
    AdmissionProbeEvidence,
    AdmissionProbeInput,
    DescribeTasksInput,
    DescribeTasksResult,
    PromotionInput,
    RolloutBatchInput,
    RolloutBatchResult,
)

if TYPE_CHECKING:
    from triloop.config import LoopName


@dataclass
class ProposalAccepted:
    """Governance's answer to a proposal: the promotion workflow that now holds it."""

    workflow_id: str
    opened: bool  # False: that proposal's promotion already ran, it is not reopened


@nexusrpc.service(name="execution")
class ExecutionService:
    """What the execution loop does for other loops."""

    run_rollouts: nexusrpc.Operation[RolloutBatchInput, RolloutBatchResult]
    probe_admission: nexusrpc.Operation[AdmissionProbeInput, AdmissionProbeEvidence]
    describe_tasks: nexusrpc.Operation[DescribeTasksInput, DescribeTasksResult]


@nexusrpc.service(name="governance")
class GovernanceService:
    """What the governance loop does for other loops."""

    propose_candidate: nexusrpc.Operation[PromotionInput, ProposalAccepted]


# The loops that offer Nexus operations, and the task queue their endpoint targets.
ENDPOINT_TARGETS: dict[LoopName, str] = {
    "execution": EXECUTION_QUEUE, "governance": GOVERNANCE_QUEUE}


def endpoint_name(queue_prefix: str, loop: str) -> str:
    """The endpoint of ``loop`` for one queue prefix (tests and benchmarks run side by side)."""
    return f"{queue_prefix}triloop-{loop}"


def endpoint_for(current_queue: str, loop: str) -> str:
    """The endpoint of ``loop`` seen from a workflow polling ``current_queue``.

    Deterministic, so a workflow may call it with ``workflow.info().task_queue``.
    """
    from triloop.workflow_api import queue_prefix

    return endpoint_name(queue_prefix(current_queue), loop)


def caller_namespace(links: Sequence[nexusrpc.Link]) -> str | None:
    """The namespace of the workflow that scheduled the operation, from the server's link.

    The Temporal server builds this link itself from the calling workflow's own namespace
    (``temporal:///namespaces/<ns>/workflows/...``); a caller cannot choose it: the Nexus
    HTTP API, where the link travels as the ``Nexus-Link`` header, takes only the server's
    own certificate (no token reaches it), and a workflow may not set that header on an
    operation it schedules (``DISALLOWED_NEXUS_HEADERS`` in the server's config). A request
    with links to more than one namespace names no caller.
    """
    namespaces = {_link_namespace(link.url) for link in links}
    namespaces.discard(None)
    if len(namespaces) != 1:
        return None
    return namespaces.pop()


def _link_namespace(url: str) -> str | None:
    parsed = urlparse(url)
    parts = parsed.path.strip("/").split("/")
    if parsed.scheme != "temporal" or len(parts) < 2 or parts[0] != "namespaces":
        return None
    return unquote(parts[1])
