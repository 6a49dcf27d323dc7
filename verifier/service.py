"""The verifier's loop: claim episodes without a verdict, replay, judge, record.

Every verdict that contradicts the execution loop's own row (success, or total reward
beyond rounding) is audited as an ``integrity_violation``: the row execution wrote is not
what the episode's actions earn.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from sqlalchemy import Engine
from sqlmodel import Session

from execution_loop.serving import TaskEnvironments
from triloop.audit import record_event
from triloop.contracts import ContractError
from triloop.models import Verdict
from triloop.weights import INTEGRITY_ACTION
from verifier.replay import Judged, agrees, replay_and_judge
from verifier.store import Pending, add_verdict, claim_pending, stored_actions

log = logging.getLogger(__name__)
VERIFIER_ACTOR: dict[str, Any] = {"service": "verifier", "roles": []}


def judge(pending: Pending, *, session: Session, environments: TaskEnvironments) -> Judged:
    """Replay one claimed episode from the seed its batch planned and judge it."""
    if pending.planned is None or pending.planned.get("task_id") != pending.task_id:
        return Judged(False, 0.0, {"unverified": f"batch {pending.batch_id} did not plan "
                                                 f"episode {pending.trajectory_id} on this task",
                                   "terms": {}})
    try:
        opened = environments.task(pending.task_id)
    except (LookupError, ValueError, ContractError) as missing:  # nothing to replay it by
        return Judged(False, 0.0, {"unverified": f"cannot open task {pending.task_id}: "
                                                 f"{missing}"[:500], "terms": {}})
    if opened.contract.agent is not None:
        return Judged(False, 0.0, {"unverified": "a black-box agent's episode is not replayed "
                                                 "from its actions", "terms": {}})
    env = opened.open()
    try:
        return replay_and_judge(env, seed=int(pending.planned["seed"]), item=opened.item,
                                actions=stored_actions(session=session,
                                                       trajectory_id=pending.trajectory_id))
    finally:
        env.close()


def verify_pending(*, engine: Engine, environments: TaskEnvironments, limit: int = 32) -> int:
    """Judge up to ``limit`` episodes without a verdict; return how many were judged."""
    with Session(engine) as session:
        claimed = claim_pending(session=session, limit=limit)
        contradicted: list[tuple[Pending, Judged]] = []
        for pending in claimed:
            judged = judge(pending, session=session, environments=environments)
            same = agrees(judged, success=pending.claimed_success,
                          total_reward=pending.claimed_reward)
            add_verdict(session=session, verdict=Verdict(
                trajectory_id=pending.trajectory_id, batch_id=pending.batch_id,
                success=judged.success, total_reward=judged.total_reward, agrees=same,
                details=judged.details))
            if not same:
                contradicted.append((pending, judged))
        session.commit()  # the verdicts, then the audit of each contradiction
    for pending, judged in contradicted:
        record_event(engine, actor=VERIFIER_ACTOR, action=INTEGRITY_ACTION,
                     resource={"kind": "trajectory", "id": pending.trajectory_id},
                     payload={"batch_id": pending.batch_id,
                              "problem": "the execution loop's row contradicts the verifier",
                              "execution": {"success": pending.claimed_success,
                                            "total_reward": pending.claimed_reward},
                              "verifier": {"success": judged.success,
                                           "total_reward": judged.total_reward}})
    return len(claimed)


def run_forever(*, engine: Engine, environments: TaskEnvironments, stop: threading.Event,
                poll_s: float = 0.5) -> None:
    """Poll until ``stop`` is set; an idle poll sleeps ``poll_s`` seconds."""
    while not stop.is_set():
        try:
            judged = verify_pending(engine=engine, environments=environments)
        except Exception:  # a database or environment outage: log, back off, poll again
            log.exception("verifier poll failed")
            judged = 0
        if judged == 0:
            stop.wait(poll_s)
