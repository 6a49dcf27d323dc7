"""Killing the governance worker during a soak: the promotion resumes at the same gate.

The worker runs as its own process (``python -m governance_loop.worker``, test gate
profile); it is killed with SIGKILL while the shadow soak's durable timer runs,
kept down past the timer, and restarted. The promotion must continue with the
shadow verdict, without re-running the offline eval it had already recorded.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from tests.factories_governance import (
    Quality,
    StandInExecution,
    execution_stand_in,
    make_world,
    wait_for,
)
from tests.temporal_helpers import own_queues, terminate_as_operator
from triloop.config import Settings
from triloop.temporal import connect
from triloop.wiring import build_authorizer
from triloop.workflow_api import (
    GOVERNANCE_QUEUE,
    PROMOTION_PROPOSED_SIGNAL,
    PROMOTION_WORKFLOW,
    PromotionInput,
    promotion_workflow_id,
)

pytestmark = [pytest.mark.faults, pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


class WorkerProcess:
    """``python -m governance_loop.worker`` with the test's settings in its environment."""

    def __init__(self, settings: Settings, log: Path) -> None:
        self.env = {
            **os.environ,
            "TRILOOP_SERVICE": "governance",
            "TRILOOP_HOME": str(settings.home),
            "TRILOOP_DATABASE_URL": settings.owner_url(),
            "TRILOOP_SECRETS_DIR": str(settings.secrets),
            "TRILOOP_TEMPORAL_ADDRESS": settings.temporal_address,
            "TRILOOP_OPA_URL": settings.opa_url,
            "TRILOOP_TASK_QUEUE_PREFIX": settings.task_queue_prefix,
            "TRILOOP_GATE_PROFILE": "test",
        }
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the worker process."""
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "governance_loop.worker"], cwd=REPO, env=self.env,
                stdout=out, stderr=subprocess.STDOUT,
            )

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown, in-flight work is simply lost."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM and wait (cleanup)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture
def worker_process(settings: Settings, stack_dir: Path) -> Iterator[WorkerProcess]:
    """A governance worker process on this test's queues (stopped at the end)."""
    proc = WorkerProcess(own_queues(settings, "kill-"),
                         stack_dir / "logs" / f"governance-worker-{uuid.uuid4().hex[:6]}.log")
    yield proc
    proc.stop()


def _one(engine: Engine, sql: str, **params: Any) -> Any:
    with engine.connect() as conn:
        return conn.execute(text(sql), params).one()


async def test_killed_worker_resumes_promotion_at_the_same_gate(
    settings: Settings, worker_process: WorkerProcess, owner_engine: Engine, role_engine: Any,
) -> None:
    prefix = worker_process.env["TRILOOP_TASK_QUEUE_PREFIX"]
    test_settings = settings.model_copy(update={"task_queue_prefix": prefix})
    authorizer = build_authorizer(settings, "governance")
    # The worker process uses the default threshold name, "promotion": make ours its newest.
    world = make_world(owner_engine, role_engine("governance"), authorizer,
                       threshold_name="promotion")
    quality = Quality()
    quality.set(world.baseline, 0.8)  # failures enough for the canary to decide early
    quality.set(world.candidate, 1.0)
    execution = StandInExecution(role_engine("execution"), quality, world.task_ids[0],
                                 requester=role_engine("web"),
                                 verifier=role_engine("verifier"))
    client = await connect(test_settings, identity="governance-fault-test", service="governance")
    proposal = PromotionInput(world.proposal_id, world.candidate, world.run_id, world.submitter)

    def gate_counts() -> dict[str, int]:
        with owner_engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT g.gate, count(*) FROM gate_result g JOIN promotion p "
                "ON p.id = g.promotion_id WHERE p.proposal_id = :p GROUP BY g.gate"),
                {"p": world.proposal_id}).all()
        return {str(r[0]): int(r[1]) for r in rows}

    def current_gate() -> str | None:
        with owner_engine.connect() as conn:
            row = conn.execute(text("SELECT current_gate FROM promotion WHERE proposal_id = :p"),
                               {"p": world.proposal_id}).first()
        return None if row is None else row[0]

    async with execution_stand_in(test_settings, execution):
        worker_process.start()
        handle = await client.start_workflow(
            PROMOTION_WORKFLOW, proposal, id=promotion_workflow_id(world.proposal_id),
            task_queue=test_settings.task_queue(GOVERNANCE_QUEUE),
            start_signal=PROMOTION_PROPOSED_SIGNAL, start_signal_args=[proposal],
        )
        try:
            # The shadow slot names the candidate: the soak timer is running.
            await wait_for(lambda: _one(owner_engine, "SELECT checkpoint_id FROM routing "
                                        "WHERE slot = 'shadow'")[0] == world.candidate,
                           timeout=120, what="the shadow soak to start", interval=0.05)
            assert current_gate() == "shadow"
            worker_process.kill()
            killed_at = time.monotonic()
            eval_episodes = _one(owner_engine, "SELECT count(*) FROM trajectory WHERE "
                                 "batch_id LIKE :b", b=f"{handle.id}-eval-%")[0]
            await asyncio.sleep(3.0)  # past the 2 s soak: the timer fires while nobody works
            assert current_gate() == "shadow" and "shadow" not in gate_counts()
            worker_process.start()
            await wait_for(lambda: current_gate() == "audit", timeout=180,
                           what="the promotion to pass shadow and canary after the restart")
            assert time.monotonic() - killed_at > 3.0
        finally:
            await terminate_as_operator(test_settings, handle)
            with owner_engine.begin() as conn:
                conn.execute(text("UPDATE routing SET checkpoint_id = NULL, share = 0 "
                                  "WHERE slot IN ('canary', 'shadow')"))
    counts = gate_counts()
    assert counts == {"stability": 1, "offline_eval": 1, "shadow": 1, "canary": 1}
    # The offline eval was not run again: same episodes as before the kill.
    assert _one(owner_engine, "SELECT count(*) FROM trajectory WHERE batch_id LIKE :b",
                b=f"{handle.id}-eval-%")[0] == eval_episodes
