"""Scale: 50 to 500 concurrent short episodes through the real RolloutWorkflow and worker.

Usage: ``python bench/scale.py [--sizes 50,100,250,500] [--steps 5] [--think-ms 500]
[--database-url OWNER_URL --temporal-address HOST:PORT --opa-url URL]``.
Without the URLs it starts its own PostgreSQL, Temporal and OPA (``triloop.devstack``)
in a temporary folder and stops them afterwards (``bench/rollout.py``'s ``services``).

For each size N a fresh execution worker process (``execution_loop.worker.build_worker``
with ``max_concurrent_episodes=N``; ``bench/rollout.py``'s scripted policy and counter
environment injected, as the tests inject theirs) runs one ``RolloutWorkflow`` batch of N
episodes with ``max_concurrency=N``; each episode authorizes with OPA and stores its
trajectory in PostgreSQL. The policy waits ``--think-ms`` per turn, standing for an
inference server, so episodes overlap as real ones do; "max open" counts how many the
worker really held at once (they start only as fast as the stack can hand them out).

The worker first plays a small warm-up batch; then its resident set is tracked (psutil
samples every 20 ms, and the kernel's high-water mark, reset first, on Linux) until the
batch returns. "idle" is its RSS before the batch (it includes torch, which the scripted
policy's tokenizer builder imports), "+MiB" the growth during the batch. Throughput is N /
(batch start to result). Every "x" column compares with the first size of the same run:
ideal scaling keeps throughput at least flat and memory growth proportional to the
episodes open at once. "worker CPU" is the worker's share of one core, "host busy" the
share of the whole machine in use (other work on it included).
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from bench.rollout import STEPS, Counter, Scripted, register, request, services
from execution_loop.environments.base import Outcome, StepResult
from execution_loop.inference.base import Generation
from triloop.config import Settings
from triloop.db import owner_engine
from triloop.temporal import connect
from triloop.workflow_api import (
    EXECUTION_QUEUE,
    ROLLOUT_WORKFLOW,
    RolloutBatchInput,
    RolloutBatchResult,
    RolloutItem,
)

WARM_UP_EPISODES = 8
READY = "worker ready"
MOST_OPEN = "most episodes open at once:"


class ShortCounter(Counter):
    """``bench/rollout.py``'s counter, done after ``TRILOOP_BENCH_STEPS`` ticks (short).

    It also counts the episodes open at once in the worker: how many really overlapped.
    """

    steps = int(os.environ.get("TRILOOP_BENCH_STEPS", "5"))
    open_now = 0
    most_open = 0
    _lock = threading.Lock()

    def __init__(self, contract: Any = None, *, sandbox: Any = None) -> None:
        super().__init__(contract, sandbox=sandbox)
        with ShortCounter._lock:
            ShortCounter.open_now += 1
            ShortCounter.most_open = max(ShortCounter.most_open, ShortCounter.open_now)

    def close(self) -> None:
        with ShortCounter._lock:
            ShortCounter.open_now -= 1

    def step(self, action: str) -> StepResult:
        result = super().step(action)
        return dataclasses.replace(result, done=self.count >= self.steps)

    def outcome(self) -> Outcome:
        done = self.count >= self.steps
        return Outcome(done, float(done), {"count": self.count})


class WaitingScripted(Scripted):
    """``bench/rollout.py``'s scripted policy that waits ``TRILOOP_BENCH_THINK_MS`` per turn.

    The wait stands for an inference server's response time: episodes then overlap the
    way real ones do, instead of finishing faster than the worker can start them.
    """

    think_s = float(os.environ.get("TRILOOP_BENCH_THINK_MS", "0")) / 1e3

    def generate(self, prompt_token_ids: list[int], **kwargs: Any) -> Generation:
        time.sleep(self.think_s)
        return super().generate(prompt_token_ids, **kwargs)


@dataclass(frozen=True)
class Point:
    """One size: throughput and the worker's memory (MiB)."""

    episodes: int
    seconds: float
    completed: int
    idle_mib: float  # worker RSS after the warm-up, before the batch
    peak_mib: float  # worker peak RSS during the batch
    most_open: int  # episodes the worker had open at the same moment
    worker_cpu_s: float  # CPU seconds the worker process used during the batch
    host_busy: float  # share of all the machine's cores busy during the batch (0..1)

    @property
    def per_s(self) -> float:
        return self.episodes / self.seconds

    @property
    def growth_mib(self) -> float:
        return self.peak_mib - self.idle_mib


def serve_worker(concurrency: int) -> None:
    """Child process: the execution worker with the bench's policy and environment."""
    from execution_loop.worker import build_worker

    settings = Settings()

    async def run() -> None:
        client = await connect(settings, identity="bench-scale-worker", service="execution")
        worker = build_worker(client, settings, policy_factory=lambda c, _d: WaitingScripted(c),
                              environment_lookup=lambda _name: ShortCounter,
                              max_concurrent_episodes=concurrency)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        async with worker:
            print(READY, flush=True)
            await stop.wait()
            print(f"{MOST_OPEN} {ShortCounter.most_open}", flush=True)

    asyncio.run(run())


class RssSampler:
    """Samples a process's resident set in a thread; reads the kernel's peak when it can."""

    def __init__(self, pid: int, interval_s: float = 0.02) -> None:
        self._process = psutil.Process(pid)
        self._status = Path(f"/proc/{pid}/status")
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.peak = 0

    def cpu_s(self) -> float:
        times = self._process.cpu_times()
        return float(times.user + times.system)

    def rss_mib(self) -> float:
        return float(self._process.memory_info().rss) / 2**20

    def __enter__(self) -> RssSampler:
        try:  # Linux: writing 5 resets the peak resident set (VmHWM) to the current one
            Path(f"/proc/{self._process.pid}/clear_refs").write_text("5")
        except OSError:
            pass  # no kernel peak to reset: the samples alone give it
        self.peak = self._process.memory_info().rss
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        try:
            for line in self._status.read_text().splitlines():
                if line.startswith("VmHWM:"):
                    self.peak = max(self.peak, int(line.split()[1]) * 1024)
        except OSError:
            pass

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.peak = max(self.peak, self._process.memory_info().rss)


def _busy_share(before: Any, after: Any) -> float:
    """Share of CPU time not idle between two ``psutil.cpu_times()`` readings."""
    total = sum(after) - sum(before)
    idle = (after.idle + getattr(after, "iowait", 0.0)) - (
        before.idle + getattr(before, "iowait", 0.0))
    return 1.0 - idle / total if total > 0 else 0.0


def worker_env(settings: Settings, steps: int, think_ms: float) -> dict[str, str]:
    """The child's environment: its settings as TRILOOP_* variables, as a deployed worker."""
    env = dict(os.environ, TRILOOP_SERVICE="execution", TRILOOP_BENCH_STEPS=str(steps),
               TRILOOP_BENCH_THINK_MS=str(think_ms))
    for name, value in settings.model_dump(exclude_none=True).items():
        env[f"TRILOOP_{name.upper()}"] = str(value)
    return env


async def run_batch(client: Any, settings: Settings, task: str, checkpoint: str,
                    episodes: int) -> tuple[float, RolloutBatchResult]:
    """One batch with every episode at once; wall seconds from start to result."""
    batch_id = request(owner_engine(settings), f"scale-{uuid.uuid4().hex[:8]}", checkpoint)
    batch = RolloutBatchInput(batch_id=batch_id, purpose="training",
                              items=[RolloutItem(task, 0, group_size=episodes)],
                              checkpoint_id=checkpoint, max_concurrency=episodes,
                              deadline_s=900.0)
    started = time.perf_counter()
    result: RolloutBatchResult = await client.execute_workflow(
        ROLLOUT_WORKFLOW, batch, id=batch.batch_id,
        task_queue=settings.task_queue(EXECUTION_QUEUE), result_type=RolloutBatchResult)
    return time.perf_counter() - started, result


async def measure(settings: Settings, task: str, checkpoint: str, size: int, steps: int,
                  think_ms: float) -> Point:
    """Start a worker for `size` concurrent episodes, warm it up, run and sample one batch."""
    prefix = f"scale{size}-{uuid.uuid4().hex[:6]}-"  # a queue per worker: no stale pollers
    settings = settings.model_copy(update={"task_queue_prefix": prefix})
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve-worker", str(size)],
        env=worker_env(settings, steps, think_ms), stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        line = await asyncio.to_thread(child.stdout.readline)
        if line.strip() != READY:
            raise RuntimeError(f"the worker did not start (exit {child.wait()}); see its stderr")
        client = await connect(settings, identity="bench-scale", service="execution")
        await run_batch(client, settings, task, checkpoint, WARM_UP_EPISODES)
        with RssSampler(child.pid) as sampler:
            idle = sampler.rss_mib()
            cpu, host = sampler.cpu_s(), psutil.cpu_times()
            seconds, result = await run_batch(client, settings, task, checkpoint, size)
            cpu, busy = sampler.cpu_s() - cpu, _busy_share(host, psutil.cpu_times())
        child.send_signal(signal.SIGTERM)
        said = await asyncio.to_thread(child.stdout.read)
        most_open = next((int(line.split()[-1]) for line in said.splitlines()
                          if line.startswith(MOST_OPEN)), 0)
        return Point(size, seconds, result.completed, idle, sampler.peak / 2**20, most_open, cpu,
                     busy)
    finally:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def print_table(points: list[Point], steps: int, think_ms: float) -> None:
    """Throughput and memory per size, and growth against the first size."""
    base = points[0]
    print(f"scale: N episodes of {steps} steps ({think_ms:.0f} ms policy wait per turn, trivial"
          " env) in one RolloutWorkflow batch, max_concurrency N; execution worker process RSS")
    print(f"{'episodes':>8} {'done':>4} {'wall s':>6} {'ep/s':>6} {'x ep/s':>6} {'max open':>8}"
          f" {'idle MiB':>8} {'peak MiB':>8} {'+MiB':>5} {'x peak':>6} {'x +MiB':>6}"
          f" {'worker CPU':>10} {'host busy':>9}")
    for p in points:
        print(f"{p.episodes:8d} {p.completed:4d} {p.seconds:6.1f} {p.per_s:6.1f}"
              f" {p.per_s / base.per_s:5.2f}x {p.most_open:8d} {p.idle_mib:8.0f} {p.peak_mib:8.0f}"
              f" {p.growth_mib:5.0f} {p.peak_mib / base.peak_mib:5.2f}x"
              f" {p.growth_mib / max(base.growth_mib, 1.0):5.1f}x"
              f" {p.worker_cpu_s / p.seconds:10.0%} {p.host_busy:9.0%}")
    last = points[-1]
    print(f"from {base.episodes} to {last.episodes} episodes"
          f" ({last.episodes / base.episodes:.0f}x): throughput {last.per_s / base.per_s:.2f}x;"
          f" worker peak memory {last.peak_mib / base.peak_mib:.2f}x, growth during the batch"
          f" {last.growth_mib:.0f} MiB = {last.growth_mib * 1024 / max(1, last.most_open):.0f} KiB"
          f" per episode open at once ({last.most_open} at most)")


async def run(args: argparse.Namespace, settings: Settings) -> list[Point]:
    """Register the bench task, then measure each size with its own worker."""
    task, checkpoint = register(owner_engine(settings))
    points = []
    for size in args.sizes:
        points.append(await measure(settings, task, checkpoint, size, args.steps, args.think_ms))
        print(f"  {size} episodes: {points[-1].per_s:.1f}/s", file=sys.stderr, flush=True)
    return points


def main() -> int:
    """Parse arguments, bring the services up if needed, measure, print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="50,100,250,500",
                        type=lambda s: [int(x) for x in s.split(",")],
                        help="concurrent episodes per batch, comma-separated")
    parser.add_argument("--steps", type=int, default=5,
                        help=f"steps per episode (1..{STEPS})")
    parser.add_argument("--think-ms", type=float, default=500.0,
                        help="policy response time per turn, ms (stands for inference)")
    parser.add_argument("--database-url", help="owner URL of a migrated database")
    parser.add_argument("--temporal-address", default="127.0.0.1:7233")
    parser.add_argument("--opa-url", default="http://127.0.0.1:8181")
    parser.add_argument("--serve-worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_worker:
        serve_worker(args.serve_worker)
        return 0
    if not 1 <= args.steps <= STEPS:
        parser.error(f"--steps must be within 1..{STEPS} (the bench contract's max_turns)")
    with services(args) as settings:
        points = asyncio.run(run(args, settings))
    print_table(points, args.steps, args.think_ms)
    bad = [p for p in points if p.completed != p.episodes]
    if bad:
        print(f"incomplete batches: {[(p.episodes, p.completed) for p in bad]}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
