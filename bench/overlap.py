"""Rollout/update overlap at staleness windows k = 1, 2, 4: idle time of each side (simulated).

A discrete-event model of ``TrainingRunWorkflow``'s schedule, driven by the workflow's own
rule (``learning_loop.asynchrony.rollouts_to_start``, continue-as-new boundaries included):
the execution side has ``--slots`` episode slots shared FIFO by every batch in flight; a
batch is ``--episodes`` episodes whose durations are log-normal (long-tailed, as multi-turn
episodes are) and ends with its last episode; the learner waits for batch k, starts the
next rollouts, then updates for ``--update`` time units. It prints each side's idle share,
throughput against k = 1 (today's default) and the mean staleness of the data learned from.
Simulated time, not wall time: the numbers depend on the model, not on this machine.
"""

from __future__ import annotations

import argparse
import heapq
import random
from dataclasses import dataclass

from learning_loop.asynchrony import rollouts_to_start


@dataclass(frozen=True)
class Result:
    """One simulated run."""

    window: int
    makespan: float
    learner_idle: float  # share of the run the learner waited for a batch
    rollout_idle: float  # share of slot time with no episode to run
    mean_staleness: float  # policy versions between a batch's sampler and its update


def simulate(window: int, *, iterations: int, slots: int, episodes: int, update_time: float,
             sigma: float, seed: int, continue_as_new_every: int = 25) -> Result:
    """The run's makespan and idle shares under one staleness window."""
    rng = random.Random(seed)
    durations = [[rng.lognormvariate(0.0, sigma) for _ in range(episodes)]
                 for _ in range(iterations)]
    free = [0.0] * slots  # when each slot is next free (a heap)
    done: dict[int, float] = {}
    version_at_start: dict[int, int] = {}
    busy = 0.0

    def start(iteration: int, now: float, version: int) -> None:
        nonlocal busy
        end = now
        for d in durations[iteration - 1]:  # FIFO list scheduling on the earliest free slot
            slot_free = heapq.heappop(free)
            finish = max(slot_free, now) + d
            heapq.heappush(free, finish)
            end, busy = max(end, finish), busy + d
        done[iteration], version_at_start[iteration] = end, version

    now, waited, k, in_flight = 0.0, 0.0, 0, 0
    cycle_start = 0
    while k < iterations:
        if in_flight == 0:
            start(k + 1, now, k)
            in_flight = 1
        waited += max(0.0, done[k + 1] - now)
        now = max(now, done[k + 1])
        in_flight -= 1
        cycle_last = min(iterations, cycle_start + continue_as_new_every)
        if k + 1 - cycle_start < continue_as_new_every:
            for iteration in rollouts_to_start(next_iteration=k + 2 + in_flight,
                                               in_flight=in_flight, window=window,
                                               last_iteration=cycle_last):
                start(iteration, now, k)
                in_flight += 1
        now += update_time
        k += 1
        if k - cycle_start >= continue_as_new_every:
            cycle_start = k
    staleness = [i - 1 - version_at_start[i] for i in range(1, iterations + 1)]
    return Result(window, now, waited / now, 1.0 - busy / (slots * now),
                  sum(staleness) / len(staleness))


def main() -> None:
    """Print the table for k = 1, 2 and 4."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--update", type=float, default=3.0, help="update time (units)")
    parser.add_argument("--sigma", type=float, default=1.0, help="log-normal sigma")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"overlap: {args.iterations} iterations, {args.episodes} episodes/batch on"
          f" {args.slots} slots, episode ~ lognormal(0, {args.sigma}), update {args.update}")
    print(f"{'k':>3} {'learner idle':>13} {'rollout idle':>13} {'throughput':>11}"
          f" {'staleness':>10}")
    results = [simulate(k, iterations=args.iterations, slots=args.slots,
                        episodes=args.episodes, update_time=args.update, sigma=args.sigma,
                        seed=args.seed) for k in (1, 2, 4)]
    base = results[0]
    for r in results:
        print(f"{r.window:>3} {r.learner_idle:>12.1%} {r.rollout_idle:>12.1%}"
              f" {base.makespan / r.makespan:>10.2f}x {r.mean_staleness:>10.2f}")


if __name__ == "__main__":
    main()
