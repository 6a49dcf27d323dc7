"""Simulated error rates of the canary and watch gates against their nominal alpha and beta.

Usage: ``python bench/gate_calibration.py [--scenarios 4000] [--seed 2026]``.

Each row runs seeded scenarios through the gates' own rules
(``governance_loop.gates.calibration``) with default thresholds (delta 5 points,
alpha 0.05, beta 0.10) and production at an 80% success rate. The canary looks 20
times and its soak ends when both arms reach the sample size planned from delta,
alpha and beta; the watch looks 100 times (25 promoted episodes each) against two
baselines of 4,000 episodes. "bound" is the nominal rate plus three Monte-Carlo
standard errors; a row is "ok" when its rate is within it. No wall clock, no
services: the same seed prints the same table.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from governance_loop.gates.calibration import (
    Outcome,
    Rewards,
    planned_canary_episodes,
    planned_watch_episodes,
    simulate_canary,
    simulate_watch,
)
from governance_loop.gates.thresholds import CanarySpec, WatchSpec

RATE = 0.8
LOOKS = 20
WATCH_LOOKS = 100
WATCH_PER_LOOK = 25
BASELINE = 4000


@dataclass(frozen=True)
class Row:
    """One scenario family: what is simulated and which rate is checked against what."""

    gate: str
    case: str
    run: Callable[[np.random.Generator, int], Outcome]
    # The verdict whose rate is an error here, and whether it must stay below or above.
    checked: str
    nominal: float
    upper: bool = True


def canary_row(case: str, canary_rate: float, checked: str, nominal: float, *,
               upper: bool = True, production_rate: float = RATE,
               spec: CanarySpec | None = None, production_per_canary: int = 1,
               rewards: Rewards | None = None, per_arm: int | None = None) -> Row:
    chosen = spec or CanarySpec()
    canary_total = per_arm or planned_canary_episodes(chosen, RATE, production_per_canary)
    per = math.ceil(canary_total / LOOKS)

    def run(rng: np.random.Generator, scenarios: int) -> Outcome:
        return simulate_canary(chosen, rng=rng, scenarios=scenarios, looks=LOOKS,
                               production_rate=production_rate, canary_rate=canary_rate,
                               per_look=(per * production_per_canary, per), rewards=rewards)

    return Row("canary", case, run, checked, nominal, upper)


def watch_row(case: str, promoted_rate: float, checked: str, nominal: float, *,
              upper: bool = True, spec: WatchSpec | None = None,
              rewards: Rewards | None = None, baseline_rate: float = RATE) -> Row:
    chosen = spec or WatchSpec()

    def run(rng: np.random.Generator, scenarios: int) -> Outcome:
        return simulate_watch(chosen, rng=rng, scenarios=scenarios, looks=WATCH_LOOKS,
                              baselines=((BASELINE, baseline_rate),) * 2,
                              promoted_rate=promoted_rate, per_look=WATCH_PER_LOOK,
                              rewards=rewards)

    return Row("watch", case, run, checked, nominal, upper)


def rows() -> list[Row]:
    """Every case of the table."""
    delta, alpha, beta = 0.05, 0.05, 0.10
    reward = CanarySpec(reward_regression_to_detect=0.05)
    return [
        canary_row("equal", RATE, "abort", alpha),
        canary_row("equal (pass = power)", RATE, "pass", 1 - alpha - beta, upper=False),
        canary_row("better by delta", RATE + delta, "abort", alpha),
        canary_row("worse by delta", RATE - delta, "pass", beta),
        canary_row("worse by delta (abort = power)", RATE - delta, "abort", 1 - beta,
                   upper=False),
        canary_row("equal, 1:9 canary share", RATE, "abort", alpha, production_per_canary=9),
        canary_row("worse by delta, 1:9 share", RATE - delta, "pass", beta,
                   production_per_canary=9),
        canary_row("equal, 200 per arm (old default)", RATE, "abort", alpha, per_arm=200),
        canary_row("rare successes (1%)", 0.01, "abort", alpha, production_rate=0.01),
        canary_row("degenerate: all failures", 0.0, "abort", 0.0, production_rate=0.0),
        canary_row("degenerate: all failures", 0.0, "pass", 0.0, production_rate=0.0),
        canary_row("degenerate: all successes", 1.0, "pass", 0.0, production_rate=1.0),
        canary_row("reward equal", RATE, "abort", alpha, spec=reward, rewards=Rewards()),
        canary_row("reward worse by delta_r", RATE, "pass", beta, spec=reward,
                   rewards=Rewards(drop=0.05)),
        canary_row("reward constant (degenerate)", RATE, "pass", 0.0, spec=reward,
                   rewards=Rewards(sd=0.0)),
        watch_row("no regression", RATE, "rollback", alpha),
        watch_row("no regression, reward tol 0", RATE, "rollback", alpha,
                  spec=WatchSpec(max_reward_regression=0.0), rewards=Rewards()),
        watch_row("no regression, reward tol 0.02", RATE, "rollback", alpha,
                  spec=WatchSpec(max_reward_regression=0.02), rewards=Rewards()),
        watch_row("reward drop = tol 0.02", RATE, "rollback", alpha,
                  spec=WatchSpec(max_reward_regression=0.02), rewards=Rewards(drop=0.02)),
        watch_row("worse by delta (rollback = power)", RATE - delta, "rollback", 1 - beta,
                  upper=False),
        watch_row("degenerate: all successes", 1.0, "rollback", 0.0, baseline_rate=1.0),
    ]


def main(argv: list[str] | None = None) -> int:
    """Print the table; exit 1 if any rate is outside its bound."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", type=int, default=4000, help="scenarios per row")
    parser.add_argument("--seed", type=int, default=2026, help="seed of the first row")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    canary, watch = CanarySpec(), WatchSpec()
    print(f"canary plan: {planned_canary_episodes(canary, RATE)} episodes per arm at "
          f"{RATE:.0%} (equal arms), {planned_canary_episodes(canary, RATE, 9)} canary "
          f"episodes at a 1:9 share; watch plan: "
          f"{planned_watch_episodes(watch, RATE, 2, BASELINE)} promoted episodes against "
          f"two baselines of {BASELINE}")
    print(f"{args.scenarios} scenarios per row, seeds {args.seed}..")
    header = (f"{'gate':<7} {'case':<34} {'verdict':<9} {'rate':>7} {'nominal':>8} "
              f"{'bound':>7} {'episodes':>9}  ok")
    print(header)
    print("-" * len(header))
    failures = 0
    for index, row in enumerate(rows()):
        outcome = row.run(np.random.default_rng(args.seed + index), args.scenarios)
        rate = outcome.rates[row.checked]
        error = 3 * math.sqrt(row.nominal * (1 - row.nominal) / args.scenarios)
        bound = row.nominal + error if row.upper else row.nominal - error
        ok = rate <= bound if row.upper else rate >= bound
        failures += not ok
        sign = "<=" if row.upper else ">="
        print(f"{row.gate:<7} {row.case:<34} {row.checked:<9} {rate:>7.4f} "
              f"{sign}{row.nominal:>6.3f} {bound:>7.4f} {outcome.mean_episodes:>9.0f}  "
              f"{'ok' if ok else 'NO'}")
    short = canary_row("", RATE, "pass", 0.0, per_arm=200).run(
        np.random.default_rng(args.seed - 1), args.scenarios)
    print(f"equal candidate, soak of 200 episodes per arm: pass {short.rates['pass']:.3f}, "
          f"abort {short.rates['abort']:.3f}, fail undecided {short.rates['fail']:.3f} "
          f"(the soak is a tenth of the plan; the fail says to extend it)")
    print(f"{failures} of {len(rows())} rows outside their bound; "
          f"{time.perf_counter() - started:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
