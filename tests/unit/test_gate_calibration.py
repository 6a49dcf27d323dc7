"""The canary and watch keep their nominal error rates, proven by seeded simulation.

Every case runs at least 1,000 scenarios through the gates' own vectorised rules
(``governance_loop.gates.calibration``) with default thresholds, looking at every
batch. A rate passes if it is within its nominal alpha or beta plus three
Monte-Carlo standard errors. The same table is printed by ``bench/gate_calibration.py``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from governance_loop.gates import (
    BinomialCounts,
    CanaryObservation,
    ThresholdSpec,
    Verdict,
    WatchObservation,
    decide_canary,
    decide_watch,
)
from governance_loop.gates.calibration import (
    Outcome,
    Rewards,
    planned_canary_episodes,
    planned_watch_episodes,
    simulate_canary,
    simulate_watch,
)
from governance_loop.gates.thresholds import CanarySpec, WatchSpec

SCENARIOS = 2000
LOOKS = 20
RATE = 0.8
CANARY = CanarySpec()  # defaults: delta 0.05, alpha 0.05, beta 0.10, 200 per arm
DELTA = CANARY.regression_to_detect
ALPHA = CANARY.false_abort_rate
BETA = CANARY.missed_regression_rate


def at_most(outcome: Outcome, name: str, nominal: float) -> None:
    """The simulated rate does not exceed nominal by more than 3 standard errors."""
    observed = outcome.rates[name]
    bound = nominal + 3 * math.sqrt(nominal * (1 - nominal) / outcome.scenarios)
    assert observed <= bound, f"{name} rate {observed:.4f} > {nominal} + 3 SE = {bound:.4f}"


def at_least(outcome: Outcome, name: str, nominal: float) -> None:
    """The simulated rate is not below nominal by more than 3 standard errors."""
    observed = outcome.rates[name]
    bound = nominal - 3 * math.sqrt(nominal * (1 - nominal) / outcome.scenarios)
    assert observed >= bound, f"{name} rate {observed:.4f} < {nominal} - 3 SE = {bound:.4f}"


def canary(canary_rate: float, *, seed: int, production_rate: float = RATE,
           spec: CanarySpec = CANARY, per_look: tuple[int, int] | None = None,
           rewards: Rewards | None = None) -> Outcome:
    """Soak until both arms reach the planned sample size, looking every 1/20 of it."""
    if per_look is None:
        per = math.ceil(planned_canary_episodes(spec, RATE) / LOOKS)
        per_look = (per, per)
    return simulate_canary(spec, rng=np.random.default_rng(seed), scenarios=SCENARIOS,
                           looks=LOOKS, production_rate=production_rate,
                           canary_rate=canary_rate, per_look=per_look, rewards=rewards)


# --- canary ---------------------------------------------------------------------------


def test_equal_candidate_is_rarely_aborted_and_passes_at_the_planned_size() -> None:
    outcome = canary(RATE, seed=11)
    at_most(outcome, "abort", ALPHA)
    # The plan gives an equal candidate power 1 - alpha to show it is not worse by delta.
    at_least(outcome, "pass", 1 - ALPHA - BETA)


def test_better_candidate_is_rarely_aborted() -> None:
    outcome = canary(RATE + DELTA, seed=12)
    at_most(outcome, "abort", ALPHA)
    at_least(outcome, "pass", 1 - BETA)


def test_candidate_worse_by_the_detectable_effect_rarely_passes() -> None:
    outcome = canary(RATE - DELTA, seed=13)
    at_most(outcome, "pass", BETA)
    at_least(outcome, "abort", 1 - BETA)  # the plan's power
    assert outcome.mean_episodes < planned_canary_episodes(CANARY, RATE)  # often aborts early


def test_unequal_arms_keep_the_error_rates() -> None:
    # The canary share is 10%: nine production episodes for each canary episode.
    per = math.ceil(planned_canary_episodes(CANARY, RATE, production_per_canary=9) / LOOKS)
    equal = canary(RATE, seed=14, per_look=(9 * per, per))
    at_most(equal, "abort", ALPHA)
    at_least(equal, "pass", 1 - ALPHA - BETA)
    worse = canary(RATE - DELTA, seed=15, per_look=(9 * per, per))
    at_most(worse, "pass", BETA)


@pytest.mark.parametrize("rate", [0.0, 1.0])
def test_degenerate_data_never_decides(rate: float) -> None:
    outcome = canary(rate, production_rate=rate, seed=16)
    assert outcome.rates == {"abort": 0.0, "pass": 0.0, "fail": 1.0}


def test_rare_successes_keep_the_false_abort_rate() -> None:
    at_most(canary(0.01, production_rate=0.01, seed=17), "abort", ALPHA)


def test_mean_reward_is_tested_beside_success_rate() -> None:
    spec = CanarySpec(reward_regression_to_detect=0.05)
    per = math.ceil(planned_canary_episodes(spec, RATE) / LOOKS)
    equal = canary(RATE, seed=18, spec=spec, per_look=(per, per), rewards=Rewards())
    at_most(equal, "abort", ALPHA)
    at_least(equal, "pass", 1 - ALPHA - BETA)
    # Success rates equal, reward worse by the effect: the reward test must not pass it.
    worse = canary(RATE, seed=19, spec=spec, per_look=(per, per), rewards=Rewards(drop=0.05))
    at_most(worse, "pass", BETA)
    flat = canary(RATE, seed=20, spec=spec, per_look=(per, per), rewards=Rewards(sd=0.0))
    assert flat.rates["pass"] == 0.0  # constant rewards: no information, no pass


def test_the_old_default_sample_cannot_pass_an_equal_candidate_on_no_information() -> None:
    # 200 episodes per arm is a tenth of the plan: an equal candidate mostly fails
    # undecided (and is told to extend the soak); it is never aborted more than alpha.
    outcome = canary(RATE, seed=21, per_look=(10, 10))
    at_most(outcome, "abort", ALPHA)
    assert outcome.rates["fail"] > 0.5


# --- watch ----------------------------------------------------------------------------

BASELINE = 4000  # episodes in each pre-promotion baseline
WATCH = WatchSpec()  # defaults: delta 0.05, alpha 0.05 over every test, beta 0.10


def watch(promoted_rate: float, *, seed: int, spec: WatchSpec = WATCH,
          rewards: Rewards | None = None, looks: int = 100,
          baseline_rate: float = RATE) -> Outcome:
    """Two baselines, 100 looks of 25 promoted episodes each."""
    return simulate_watch(spec, rng=np.random.default_rng(seed), scenarios=SCENARIOS,
                          looks=looks, baselines=((BASELINE, baseline_rate),) * 2,
                          promoted_rate=promoted_rate, per_look=25, rewards=rewards)


@pytest.mark.parametrize("tolerance", [None, 0.0, 0.02])
def test_watch_rarely_rolls_back_a_model_that_did_not_regress(tolerance: float | None) -> None:
    spec = WatchSpec(max_reward_regression=tolerance)
    rewards = None if tolerance is None else Rewards()
    at_most(watch(RATE, seed=30, spec=spec, rewards=rewards), "rollback",
            spec.false_rollback_rate)


def test_watch_rarely_rolls_back_a_reward_drop_within_tolerance() -> None:
    spec = WatchSpec(max_reward_regression=0.02)
    at_most(watch(RATE, seed=31, spec=spec, rewards=Rewards(drop=0.02)), "rollback",
            spec.false_rollback_rate)


def test_watch_catches_a_regression_by_the_detectable_effect() -> None:
    spec = WATCH
    planned = planned_watch_episodes(spec, RATE, baselines=2, baseline_episodes=BASELINE)
    assert planned is not None and planned <= 100 * 25
    outcome = watch(RATE - spec.regression_to_detect, seed=32, spec=spec)
    at_least(outcome, "rollback", 1 - spec.missed_regression_rate)


def test_watch_never_rolls_back_on_degenerate_data() -> None:
    assert watch(1.0, seed=33, baseline_rate=1.0).rates["rollback"] == 0.0
    assert watch(0.0, seed=34, baseline_rate=0.0).rates["rollback"] == 0.0


# --- the gate functions say so --------------------------------------------------------

SPEC = ThresholdSpec(version="thr-cal", min_success_rate=0.0, max_regression_vs_production=1.0,
                     min_samples=1)


def test_degenerate_canary_continues_with_not_enough_information() -> None:
    zeros = CanaryObservation(BinomialCounts(400, 0), BinomialCounts(400, 0),
                              soak_complete=False, look=3)
    decision = decide_canary(zeros, SPEC)
    assert decision.verdict is Verdict.CONTINUE
    assert "continue: not enough information at look 3" in decision.reasons[0]
    assert decision.evidence["metrics"][0]["degenerate"] is True
    ended = decide_canary(CanaryObservation(BinomialCounts(400, 400), BinomialCounts(400, 400),
                                            soak_complete=True, look=9), SPEC)
    assert ended.verdict is Verdict.FAIL and ended.restore_routing
    assert "without enough information" in ended.reasons[0]


def test_canary_evidence_names_the_test_the_look_and_the_plan() -> None:
    decision = decide_canary(CanaryObservation(BinomialCounts(400, 320), BinomialCounts(400, 322),
                                               soak_complete=False, look=4), SPEC)
    assert decision.verdict is Verdict.CONTINUE
    assert "soak in progress at look 4" in decision.reasons[0]
    assert decision.evidence["test"] == "one-sided normal-mixture SPRT (always valid)"
    assert decision.evidence["look"] == 4
    metric = decision.evidence["metrics"][0]
    assert metric["planned_episodes_per_arm"] == planned_canary_episodes(
        SPEC.canary, metric_rate(400 + 400, 320 + 322))
    assert 0 < metric["information_fraction"] < 1
    # Equal arms: the plan at the current share is the per-arm plan.
    assert metric["planned_canary_episodes_at_current_share"] == metric["planned_episodes_per_arm"]


def metric_rate(episodes: int, successes: int) -> float:
    return successes / episodes


def test_degenerate_watch_does_not_roll_back() -> None:
    decision = decide_watch(WatchObservation(BinomialCounts(500, 0), BinomialCounts(300, 0),
                                             period_complete=False, look=2), SPEC)
    assert decision.verdict is Verdict.CONTINUE
    assert "continue: not enough information" in decision.reasons[0]
