"""Policy decision latency and throughput over loopback, against a bare HTTP round trip.

Usage: ``python bench/policy.py [--opa-url URL] [--requests N] [--concurrency 16]``.
Without ``--opa-url`` it starts its own OPA on the repository's policies (decision
logging on, as in production) and stops it afterwards.

The input is the heaviest realistic path: the governance worker approving a
promotion for an operator (delegation, role grants, separation of duties). The
baseline is ``GET /health`` on the same OPA with the same client, so the ratio is
what the policy costs over loopback HTTP itself. Target: p99 < 5 ms sequential.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from triloop.config import Settings
from triloop.devstack.processes import free_port, stop_recorded
from triloop.devstack.servers import repo_root, start_opa
from triloop.policy import Actor, OpaClient, Resource, acting_for

ACTOR = Actor("governance")
ACTION = "approve"
RESOURCE = Resource(
    "promotion",
    "promo-7f3a",
    attrs={"submitted_by": "sam", "audited_by": "ada", "checkpoint": "sha256:9c1e",
           "promotion_opened_at": "2026-06-02T00:00:00Z"},
)
# The operator's role predates the promotion (a role newer than it is refused).
CONTEXT = acting_for(Actor("web", "olga", ("operator",)), request_id="req-1")
CONTEXT["on_behalf_of"]["role_since"] = "2026-06-01T00:00:00Z"


@dataclass(frozen=True)
class Row:
    """One line of the table: latencies in milliseconds, throughput in calls per second."""

    name: str
    p50_ms: float
    p99_ms: float
    per_s: float


def _row(name: str, latencies: list[float], wall_s: float) -> Row:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return Row(name, statistics.median(ordered) * 1e3, p99 * 1e3, len(ordered) / wall_s)


def _sequential(name: str, call: Callable[[], object], n: int) -> Row:
    for _ in range(min(200, n)):  # warm the pool and OPA's caches
        call()
    latencies = []
    start = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - t0)
    return _row(name, latencies, time.perf_counter() - start)


async def _concurrent(
    name: str, call: Callable[[], Awaitable[object]], n: int, callers: int
) -> Row:
    await asyncio.gather(*(call() for _ in range(callers)))  # open the connections
    latencies: list[float] = []

    async def caller(count: int) -> None:
        for _ in range(count):
            t0 = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - t0)

    start = time.perf_counter()
    await asyncio.gather(*(caller(n // callers) for _ in range(callers)))
    return _row(name, latencies, time.perf_counter() - start)


def run(url: str, n: int, callers: int, tokens: dict[str, str] | None = None) -> list[Row]:
    """Measure decisions and the /health baseline, sequential then concurrent."""
    client = OpaClient(url, tokens=tokens)
    check = client.decide(ACTOR, ACTION, RESOURCE, CONTEXT)
    if not check.allow:
        raise SystemExit(f"the benchmark input was denied, fix it first: {check.reasons}")
    health = httpx.Client(timeout=2.0)
    rows = [
        _sequential("health (baseline), sequential", lambda: health.get(f"{url}/health"), n),
        _sequential(
            "decision, sequential", lambda: client.decide(ACTOR, ACTION, RESOURCE, CONTEXT), n
        ),
    ]

    async def concurrent() -> list[Row]:
        # The same path as adecide: the pooled sync client in worker threads.
        return [
            await _concurrent(
                f"health (baseline), {callers} callers",
                lambda: asyncio.to_thread(health.get, f"{url}/health"),
                n,
                callers,
            ),
            await _concurrent(
                f"decision, {callers} callers",
                lambda: client.adecide(ACTOR, ACTION, RESOURCE, CONTEXT),
                n,
                callers,
            ),
        ]

    rows += asyncio.run(concurrent())
    health.close()
    client.close()
    return rows


def print_table(rows: list[Row]) -> None:
    """Print the rows and the decision/baseline ratios."""
    print(f"{'':34} {'p50 ms':>8} {'p99 ms':>8} {'calls/s':>9}")
    for row in rows:
        print(f"{row.name:34} {row.p50_ms:8.2f} {row.p99_ms:8.2f} {row.per_s:9.0f}")
    for base, decision in ((rows[0], rows[1]), (rows[2], rows[3])):
        print(
            f"{decision.name}: {decision.p50_ms / base.p50_ms:.1f}x the baseline's p50, "
            f"{decision.per_s / base.per_s:.2f}x its throughput"
        )
    verdict = "meets" if rows[1].p99_ms < 5.0 else "misses"
    print(f"sequential p99 {rows[1].p99_ms:.2f} ms {verdict} the 5 ms target")


def main() -> None:
    """Parse arguments, start OPA if needed, run, print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--opa-url", help="an OPA already serving triloop's policies")
    parser.add_argument("--requests", type=int, default=2000, help="decisions per measurement")
    parser.add_argument("--concurrency", type=int, default=16, help="async callers")
    args = parser.parse_args()
    if args.opa_url:
        print_table(run(args.opa_url.rstrip("/"), args.requests, args.concurrency,
                        Settings().opa_tokens()))
        return
    with tempfile.TemporaryDirectory(prefix="triloop-bench-") as tmp:
        port = free_port()
        proc = start_opa(
            policies=repo_root() / "policies", port=port, run_dir=Path(tmp), log_dir=Path(tmp),
            secrets_dir=Path(tmp) / "secrets",
        )
        try:
            tokens = Settings(home=Path(tmp)).opa_tokens()
            print_table(run(f"http://127.0.0.1:{port}", args.requests, args.concurrency, tokens))
        finally:
            stop_recorded(proc.pid_path)


if __name__ == "__main__":
    main()
