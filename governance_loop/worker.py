"""The governance worker: the loop's only wiring point (``python -m governance_loop.worker``).

It builds the governance role's engine, the OPA authorizer and the Temporal
client (governance's token, in the governance namespace), picks the gate timing for
``settings.gate_profile`` (``PromotionTiming.for_profile``) and polls the governance task
queue, which also serves the
``propose_candidate`` Nexus operation that learning hands its proposals to. Workflows cannot
read settings, so the durations reach them through the ``open_promotion``
activity's result, recorded once in each promotion's history.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy import Engine
from temporalio.client import Client
from temporalio.worker import Worker

from governance_loop.activities.admission import AdmissionActivities
from governance_loop.activities.evidence import EvidenceActivities
from governance_loop.activities.promotion import DEFAULT_THRESHOLD_NAME, PromotionActivities
from governance_loop.activities.rollback import RollbackActivities
from governance_loop.activities.task_set_admission import TaskSetAdmissionActivities
from governance_loop.activities.writes import GovernanceWriteActivities
from governance_loop.activity_support import GOVERNANCE
from governance_loop.admission import AdmissionBudgets
from governance_loop.durations import PromotionTiming
from governance_loop.gate_metrics import GateStates
from governance_loop.interruptions import InterruptionWatch
from governance_loop.nexus_handlers import GovernanceNexusHandlers
from governance_loop.workflows import (
    AdmissionWorkflow,
    GovernanceWriteWorkflow,
    PromotionWorkflow,
    RollbackWorkflow,
    TaskSetAdmissionWorkflow,
    TaskSetRegistration,
)
from triloop.artifact_backends import open_shared_store, open_store
from triloop.config import Settings, get_settings
from triloop.db import role_engine
from triloop.metrics import register_collector
from triloop.nexus_caller import NexusCallerCheck
from triloop.policy import Authorizer
from triloop.wiring import build_authorizer
from triloop.worker_serve import serve
from triloop.workflow_api import GOVERNANCE_QUEUE


def build_worker(
    client: Client,
    settings: Settings,
    *,
    engine: Engine | None = None,
    authorizer: Authorizer | None = None,
    threshold_name: str = DEFAULT_THRESHOLD_NAME,
    budgets: AdmissionBudgets | None = None,
    timing: PromotionTiming | None = None,
) -> Worker:
    """A worker on the governance queue with every governance workflow and activity."""
    engine = engine or role_engine(settings, "governance")
    authorizer = authorizer or build_authorizer(settings, "governance")
    timing = timing or PromotionTiming.for_profile(settings.gate_profile)
    register_collector("gate_states", GateStates(engine))  # gate states on /metrics
    promotion = PromotionActivities(engine, authorizer, timing=timing,
                                    threshold_name=threshold_name, home=settings.home,
                                    store=open_shared_store(settings))
    evidence = EvidenceActivities(engine, authorizer)
    rollback = RollbackActivities(engine, authorizer)
    writes = GovernanceWriteActivities(engine, authorizer, store=open_store(settings))
    admission = AdmissionActivities(engine, authorizer, budgets=budgets,
                                    decision_deadline_s=timing.approval_deadline_s)
    set_admission = TaskSetAdmissionActivities(engine, authorizer, budgets=budgets,
                                               decision_deadline_s=timing.approval_deadline_s)
    return Worker(
        client,
        task_queue=settings.task_queue(GOVERNANCE_QUEUE),
        workflows=[PromotionWorkflow, RollbackWorkflow, AdmissionWorkflow, GovernanceWriteWorkflow,
                   TaskSetRegistration, TaskSetAdmissionWorkflow],
        activities=[
            promotion.open_promotion, promotion.mark_promotion, promotion.record_gate,
            promotion.record_rollout_batch,
            promotion.set_routing, promotion.record_human_decision, promotion.promote_candidate,
            promotion.close_promotion,
            evidence.decide_offline_eval, evidence.decide_shadow, evidence.look_canary,
            evidence.look_watch, rollback.rollback_deployment,
            admission.load_admission_task, admission.record_admission_evidence,
            admission.decide_task_admission, set_admission.load_task_set_admission,
            set_admission.record_task_set_evidence, set_admission.decide_task_set_admission,
            writes.register_environment_version,
            writes.create_eval_set, writes.set_threshold, writes.prepare_task_set,
            writes.store_task_set,
        ],
        nexus_service_handlers=[GovernanceNexusHandlers(
            NexusCallerCheck(settings, server=GOVERNANCE, authorizer=authorizer))],
        # Activities are blocking (database, OPA over a sync client): run them in threads.
        activity_executor=ThreadPoolExecutor(max_workers=16),
        identity=client.identity,
    )


def main() -> None:
    """Entry point of ``python -m governance_loop.worker``."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = get_settings()
    engine = role_engine(settings, "governance")
    authorizer = build_authorizer(settings, "governance")

    def watch(client: Client) -> Coroutine[Any, Any, None]:
        # Resets, terminations and cancellations of promotions, read from the server.
        return InterruptionWatch(client, engine, authorizer).run_forever()

    asyncio.run(serve(settings, "governance", lambda client: [build_worker(
        client, settings, engine=engine, authorizer=authorizer)], background=watch))


if __name__ == "__main__":
    main()
