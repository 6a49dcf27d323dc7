"""Rollback latency: an operator's request until production routing names the target.

Usage: ``python bench/rollback.py [-n 50] [--database-url OWNER_URL
--temporal-address HOST:PORT --opa-url URL]``. Without the URLs it starts its own
PostgreSQL, Temporal and OPA (``triloop.devstack``) in a temporary folder.

Each rollback is a ``RollbackWorkflow`` on an in-process governance worker: OPA
is asked for the operator, then alias, history and routing change in one
transaction. "Effective" is when a fresh read of the routing table (what the
execution loop does before each episode) names the target. Rollbacks alternate
between two checkpoints: a rolled-back checkpoint is never a target again until it
is deployed anew, so before each timed rollback (outside the timing) both are
bootstrapped again, the target first. The
baseline is the same routing change as one plain ``UPDATE`` by the governance
role: the ratio is what authorization, audit, history and Temporal cost on top.
Target: p99 request-to-effective under 2 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, text

from governance_loop.activities.rollback import bootstrap_production
from governance_loop.worker import build_worker
from triloop.config import Settings
from triloop.db import owner_engine, role_engine
from triloop.temporal import connect
from triloop.wiring import build_authorizer
from triloop.workflow_api import GOVERNANCE_QUEUE, ROLLBACK_WORKFLOW, RollbackInput, RollbackResult

TARGET_S = 2.0


@dataclass(frozen=True)
class RollbackBench:
    """Latencies in seconds: rollbacks through governance, and plain updates."""

    rollbacks: list[float]
    plain_updates: list[float]


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def _checkpoints(owner: Engine) -> tuple[str, str]:
    # Checkpoints are the learning loop's rows; the benchmark inserts two as the owner. Their
    # ids are their weights' sha256 (the database checks the form; governance verifies the
    # weights before production moves), so each gets a one-tensor weights folder.
    import tempfile

    import numpy as np
    from safetensors.numpy import save_file

    from triloop.weights import safetensors_digest

    ids = []
    root = Path(tempfile.mkdtemp(prefix="triloop-rollback-bench-"))
    for value in (1.0, 2.0):
        folder = root / str(value)
        folder.mkdir()
        save_file({"w": np.full(4, value, dtype=np.float32)}, str(folder / "model.safetensors"))
        checkpoint = safetensors_digest(folder)
        with owner.begin() as conn:
            conn.execute(text(
                "INSERT INTO checkpoint (id, base_model, artifact_uri, created_by, data) "
                "VALUES (:i, 'bench', :u, 'bench', '{}') ON CONFLICT DO NOTHING"),
                {"i": checkpoint, "u": folder.as_uri()})
        ids.append(checkpoint)
    return ids[0], ids[1]


def _operator(owner: Engine) -> str:
    """An operator who held the role before anything here (set-up, as the owner)."""
    name = f"bench-operator-{uuid.uuid4().hex[:6]}"
    with owner.begin() as conn:
        conn.execute(text(
            "INSERT INTO app_user (name, roles, created_by, disabled, created_at) "
            "VALUES (:n, ARRAY['operator'], 'bench', false, now() - interval '1 day')"),
            {"n": name})
    return name


def _decision(web: Engine, operator: str, index: int) -> str:
    """The operator's rollback decision as the web service records it (its role only)."""
    decision_id = f"bench-rollback-{uuid.uuid4().hex}"
    with web.begin() as conn:
        conn.execute(text(
            "INSERT INTO human_decision (id, kind, subject, decision, user_name, comment, "
            "details) VALUES (:i, 'rollback', 'production', 'rollback', :u, :c, '{}')"),
            {"i": decision_id, "u": operator, "c": f"bench rollback {index}"})
    return decision_id


def _routed(engine: Engine) -> str:
    with engine.connect() as conn:
        return str(conn.execute(text(
            "SELECT checkpoint_id FROM routing WHERE slot = 'production'")).scalar_one())


async def measure(settings: Settings, rollbacks: int) -> RollbackBench:
    """Run the rollbacks and the plain-update baseline; production ends where it began."""
    gov, reader = role_engine(settings, "governance"), role_engine(settings, "execution")
    authorizer = build_authorizer(settings, "governance")
    first, second = _checkpoints(owner_engine(settings))
    client = await connect(settings, identity="rollback-bench", service="governance")
    operator = _operator(owner_engine(settings))
    web = role_engine(settings, "web")
    queue = settings.task_queue(GOVERNANCE_QUEUE)
    timings: list[float] = []
    async with build_worker(client, settings, engine=gov, authorizer=authorizer):
        for index in range(rollbacks + rollbacks % 2):  # even: end where it began
            expected = second if index % 2 == 0 else first
            current = first if expected == second else second
            for checkpoint in (expected, current):  # serving: current; target: expected
                await asyncio.to_thread(
                    bootstrap_production, engine=gov, authorizer=authorizer,
                    checkpoint_id=checkpoint, requested_by="bench", replace=True)
            started = time.perf_counter()
            result: RollbackResult = await client.execute_workflow(
                ROLLBACK_WORKFLOW,
                RollbackInput(decision_id=_decision(web, operator, index)),
                id=f"rollback-bench-{uuid.uuid4().hex}", task_queue=queue,
                result_type=RollbackResult)
            while await asyncio.to_thread(_routed, reader) != expected:
                await asyncio.sleep(0.001)
            timings.append(time.perf_counter() - started)
            assert result.checkpoint_id == expected
    plain: list[float] = []
    for index in range(len(timings)):
        checkpoint = second if index % 2 == 0 else first
        started = time.perf_counter()
        with gov.begin() as conn:
            conn.execute(text("UPDATE routing SET checkpoint_id = :c WHERE slot = 'production'"),
                         {"c": checkpoint})
        while _routed(reader) != checkpoint:
            time.sleep(0.001)
        plain.append(time.perf_counter() - started)
    return RollbackBench(timings, plain)


def report(bench: RollbackBench) -> str:
    """The table the benchmark prints."""
    rows = [("rollback (governance)", bench.rollbacks), ("plain UPDATE", bench.plain_updates)]
    lines = [f"{'':24}{'n':>5}{'p50 ms':>10}{'p99 ms':>10}"]
    for name, values in rows:
        lines.append(f"{name:24}{len(values):>5}{percentile(values, 50) * 1e3:>10.1f}"
                     f"{percentile(values, 99) * 1e3:>10.1f}")
    p50 = percentile(bench.rollbacks, 50) / percentile(bench.plain_updates, 50)
    p99 = percentile(bench.rollbacks, 99) / percentile(bench.plain_updates, 99)
    worst = percentile(bench.rollbacks, 99)
    verdict = "meets" if worst < TARGET_S else "MISSES"
    lines.append(f"ratio rollback / plain UPDATE: p50 {p50:.1f}x, p99 {p99:.1f}x")
    lines.append(f"p99 request-to-effective {worst:.3f} s {verdict} the {TARGET_S:g} s target")
    return "\n".join(lines)


@contextlib.contextmanager
def services(args: argparse.Namespace) -> Iterator[Settings]:
    """The given services, or a throwaway stack started for this run."""
    prefix = f"bench-{uuid.uuid4().hex[:6]}-"
    if args.database_url:
        yield Settings(database_url=args.database_url, temporal_address=args.temporal_address,
                       opa_url=args.opa_url, task_queue_prefix=prefix)
        return
    from triloop.devstack.ephemeral import ephemeral_stack

    with ephemeral_stack(queue_prefix=prefix) as settings:
        yield settings


def main() -> None:
    """Parse arguments, run, print."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("-n", "--rollbacks", type=int, default=50)
    parser.add_argument("--database-url", help="owner URL of a migrated database")
    parser.add_argument("--temporal-address", default="127.0.0.1:7233")
    parser.add_argument("--opa-url", default="http://127.0.0.1:8181")
    args = parser.parse_args()
    with services(args) as settings:
        bench = asyncio.run(measure(settings, args.rollbacks))
    print(report(bench))


if __name__ == "__main__":
    main()
