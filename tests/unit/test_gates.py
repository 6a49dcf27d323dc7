"""Promotion gates: offline eval, shadow, canary, watch, human decisions, gate order."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from governance_loop.durations import PromotionTiming
from governance_loop.gates import (
    GATE_ORDER,
    BinomialCounts,
    CanaryObservation,
    CanarySpec,
    EpisodeStats,
    EvalSetResult,
    GateDecision,
    GateOrderError,
    HumanDecisionError,
    ShadowSample,
    ShadowSpec,
    ThresholdSpec,
    ThresholdSpecError,
    Verdict,
    WatchObservation,
    WatchSpec,
    decide_canary,
    decide_human,
    decide_offline_eval,
    decide_shadow,
    decide_watch,
    failed_gate,
    next_gate,
    refuse_out_of_turn,
    results_from_decisions,
)
from triloop.decisions import HumanDecision
from triloop.statuses import DecisionKind, Gate


@pytest.fixture
def thresholds() -> ThresholdSpec:
    return ThresholdSpec(
        version="thr-7",
        min_success_rate=0.6,
        max_regression_vs_production=0.05,
        min_samples=50,
        max_reward_regression_vs_production=0.1,
        shadow=ShadowSpec(min_samples=30, agreement_floor=0.9, max_mean_reward_regression=0.2),
        canary=CanarySpec(min_samples_per_arm=50, regression_to_detect=0.1),
        watch=WatchSpec(min_samples=50, regression_to_detect=0.1),
    )


def assert_json(decision: GateDecision) -> None:
    json.dumps(decision.to_dict(), allow_nan=False)
    assert decision.evidence["threshold_version"] == "thr-7"


def stats(n: int, successes: int, reward: float = 0.5, std: float = 0.3) -> EpisodeStats:
    return EpisodeStats(episodes=n, successes=successes, reward_mean=reward, reward_std=std)


def eval_set(name: str, cand: EpisodeStats, prod: EpisodeStats | None) -> EvalSetResult:
    return EvalSetResult(eval_set=name, eval_set_version="sha256:abc", candidate=cand,
                         production=prod)


# --- offline eval -----------------------------------------------------------------------


def test_offline_eval_passes_with_evidence(thresholds: ThresholdSpec) -> None:
    decision = decide_offline_eval(
        [eval_set("math", stats(100, 80), stats(100, 78)), eval_set("code", stats(60, 45), None)],
        thresholds,
    )
    assert decision.passed and decision.verdict is Verdict.PASS
    assert_json(decision)
    first = decision.evidence["eval_sets"][0]
    assert first["candidate"]["episodes"] == 100
    assert first["candidate"]["success_rate"]["estimate"] == 0.8
    assert first["success_rate_delta"]["low"] < 0.02 < first["success_rate_delta"]["high"]
    assert decision.evidence["eval_sets"][1]["production"] is None


@pytest.mark.parametrize(
    ("cand", "prod", "named"),
    [
        (stats(100, 50), stats(100, 52), "min_success_rate"),
        (stats(100, 70), stats(100, 80), "max_regression_vs_production"),
        (stats(100, 80, reward=0.3), stats(100, 80, reward=0.5), "max_reward_regression"),
        (stats(20, 16), stats(100, 80), "candidate has 20 episodes, min_samples"),
        (stats(100, 80), stats(10, 8), "production has 10 episodes, min_samples"),
    ],
)
def test_offline_eval_fails_naming_the_threshold(
    thresholds: ThresholdSpec, cand: EpisodeStats, prod: EpisodeStats, named: str
) -> None:
    decision = decide_offline_eval([eval_set("math", cand, prod)], thresholds)
    assert not decision.passed and decision.verdict is Verdict.FAIL
    assert len(decision.reasons) == 1
    assert named in decision.reasons[0] and "'math'" in decision.reasons[0]
    assert "thr-7" in decision.reasons[0]
    assert_json(decision)


def test_a_success_drop_of_exactly_the_tolerance_is_within_it(
    thresholds: ThresholdSpec,
) -> None:
    # 75/100 - 80/100 is -0.050000000000000044 in floats: compared exactly, it is the 0.05
    # the threshold allows; one episode fewer is beyond it.
    assert 0.75 - 0.80 < -thresholds.max_regression_vs_production
    within = decide_offline_eval([eval_set("math", stats(100, 75), stats(100, 80))], thresholds)
    assert within.passed, within.reasons
    beyond = decide_offline_eval([eval_set("math", stats(100, 74), stats(100, 80))], thresholds)
    assert not beyond.passed
    assert "max_regression_vs_production" in beyond.reasons[0]


def test_offline_eval_lists_every_violation(thresholds: ThresholdSpec) -> None:
    decision = decide_offline_eval(
        [eval_set("a", stats(10, 2), stats(100, 90)), eval_set("b", stats(100, 90), None)],
        thresholds,
    )
    text = "\n".join(decision.reasons)
    for name in ("min_samples", "min_success_rate", "max_regression_vs_production"):
        assert name in text
    assert "'b'" not in text


def test_offline_eval_refuses_empty_and_duplicate_results(thresholds: ThresholdSpec) -> None:
    assert not decide_offline_eval([], thresholds).passed
    with pytest.raises(ValueError, match="more than once"):
        decide_offline_eval([eval_set("a", stats(100, 90), None)] * 2, thresholds)


def test_threshold_spec_round_trips_and_refuses_bad_input(thresholds: ThresholdSpec) -> None:
    assert ThresholdSpec.from_mapping(thresholds.to_dict()) == thresholds
    with pytest.raises(ThresholdSpecError, match="unknown fields"):
        ThresholdSpec.from_mapping({**thresholds.to_dict(), "min_sucess_rate": 0.5})
    with pytest.raises(ThresholdSpecError, match="unknown fields"):
        ThresholdSpec.from_mapping({**thresholds.to_dict(), "canary": {"alpha": 0.1}})
    with pytest.raises(ThresholdSpecError, match="incomplete"):
        ThresholdSpec.from_mapping({"version": "x"})
    with pytest.raises(ThresholdSpecError, match="min_success_rate"):
        ThresholdSpec(version="x", min_success_rate=60, max_regression_vs_production=0.0,
                      min_samples=1)
    with pytest.raises(ThresholdSpecError, match="false_abort_rate"):
        CanarySpec(false_abort_rate=0.0)


# --- shadow -----------------------------------------------------------------------------


def shadow_samples(
    n: int, agreement: float, delta: float, seed: int = 0, noise: float = 0.1
) -> list[ShadowSample]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prod = rng.random()
        out.append(ShadowSample(
            episode_id=f"e{i}", steps_compared=10, steps_agreed=round(10 * agreement),
            production_reward=prod, candidate_reward=prod + delta + rng.gauss(0, noise),
        ))
    return out


def test_shadow_passes_on_high_agreement(thresholds: ThresholdSpec) -> None:
    decision = decide_shadow(shadow_samples(40, agreement=0.9, delta=-0.05), thresholds)
    assert decision.passed, decision.reasons
    assert decision.evidence["reward_delta_significantly_negative"] is True
    assert decision.evidence["agreement_rate"] == 0.9
    assert decision.evidence["paired_episodes"] == 40
    assert_json(decision)


def test_shadow_passes_low_agreement_when_reward_not_worse(thresholds: ThresholdSpec) -> None:
    decision = decide_shadow(shadow_samples(40, agreement=0.3, delta=0.05), thresholds)
    assert decision.passed, decision.reasons
    assert "not significantly negative" in decision.reasons[0]


def test_shadow_fails_low_agreement_and_significant_loss(thresholds: ThresholdSpec) -> None:
    decision = decide_shadow(shadow_samples(40, agreement=0.5, delta=-0.1), thresholds)
    assert not decision.passed
    assert "agreement_floor" in decision.reasons[0]
    assert "significantly negative" in decision.reasons[0]
    assert decision.evidence["reward_delta"]["high"] < 0


def test_shadow_guard_fails_a_large_loss_even_at_high_agreement(
    thresholds: ThresholdSpec,
) -> None:
    decision = decide_shadow(shadow_samples(40, agreement=1.0, delta=-0.5), thresholds)
    assert not decision.passed
    assert "max_mean_reward_regression" in decision.reasons[0]


def test_shadow_fails_below_min_samples(thresholds: ThresholdSpec) -> None:
    decision = decide_shadow(shadow_samples(29, agreement=1.0, delta=0.0), thresholds)
    assert not decision.passed
    assert "min_samples is 30" in decision.reasons[0]
    assert not decide_shadow([], thresholds).passed


def test_shadow_sample_refuses_impossible_counts() -> None:
    with pytest.raises(ValueError, match="steps_agreed"):
        ShadowSample("e1", steps_compared=3, steps_agreed=4, production_reward=0.0,
                     candidate_reward=0.0)


# --- canary -----------------------------------------------------------------------------


def simulate_canary(
    spec: ThresholdSpec, seed: int, canary_rate: float, production_rate: float,
    looks: int = 20, batch: int = 20,
) -> tuple[list[GateDecision], int]:
    """Feed cumulative counts look by look until a final decision; the last look ends the soak."""
    rng = random.Random(seed)
    canary = production = BinomialCounts(0, 0)
    decisions = []
    for look in range(1, looks + 1):
        c = sum(rng.random() < canary_rate for _ in range(batch))
        p = sum(rng.random() < production_rate for _ in range(batch))
        canary = BinomialCounts(canary.episodes + batch, canary.successes + c)
        production = BinomialCounts(production.episodes + batch, production.successes + p)
        decision = decide_canary(
            CanaryObservation(canary, production, look == looks, look=look), spec)
        decisions.append(decision)
        if decision.final:
            break
    return decisions, canary.episodes


def test_canary_never_decides_before_min_samples(thresholds: ThresholdSpec) -> None:
    # Even a candidate that always fails must wait for 50 episodes per arm.
    decisions, episodes = simulate_canary(thresholds, 1, 0.0, 0.9, batch=10)
    assert [d.verdict for d in decisions[:4]] == [Verdict.CONTINUE] * 4
    assert "min_samples_per_arm is 50" in decisions[0].reasons[0]
    assert decisions[-1].verdict is Verdict.ABORT_REGRESSION
    assert episodes == 50


def test_canary_aborts_on_clear_regression_and_restores_routing(
    thresholds: ThresholdSpec,
) -> None:
    decisions, episodes = simulate_canary(thresholds, seed=7, canary_rate=0.55,
                                          production_rate=0.8)
    final = decisions[-1]
    assert final.verdict is Verdict.ABORT_REGRESSION and not final.passed
    assert final.restore_routing
    assert episodes < 400  # aborted before the soak ended
    metric = final.evidence["metrics"][0]
    assert metric["metric"] == "success rate"
    assert metric["log_evidence_regressed"] >= final.evidence["abort_boundary"]
    assert "regressed" in final.reasons[0]
    assert_json(final)


def test_canary_passes_clear_non_regression_only_at_soak_end(
    thresholds: ThresholdSpec,
) -> None:
    decisions, episodes = simulate_canary(thresholds, seed=3, canary_rate=0.85,
                                          production_rate=0.8)
    assert all(d.verdict is Verdict.CONTINUE for d in decisions[:-1])
    final = decisions[-1]
    assert final.verdict is Verdict.PASS and final.passed and not final.restore_routing
    assert episodes == 400
    metric = final.evidence["metrics"][0]
    assert metric["log_evidence_not_worse"] >= final.evidence["pass_boundary"]
    assert "no regression at look 20" in final.reasons[0]


def test_canary_error_rates_over_seeds(thresholds: ThresholdSpec) -> None:
    same = Counter(simulate_canary(thresholds, s, 0.8, 0.8)[0][-1].verdict for s in range(40))
    worse = Counter(simulate_canary(thresholds, s, 0.6, 0.8)[0][-1].verdict for s in range(40))
    assert same[Verdict.ABORT_REGRESSION] <= 4 and same[Verdict.PASS] >= 30
    assert worse[Verdict.ABORT_REGRESSION] >= 38 and worse[Verdict.PASS] == 0


def test_canary_fails_when_soak_ends_short_or_undecided(thresholds: ThresholdSpec) -> None:
    short = decide_canary(
        CanaryObservation(BinomialCounts(10, 9), BinomialCounts(200, 160), True), thresholds
    )
    assert short.verdict is Verdict.FAIL and short.restore_routing
    assert "too few episodes" in short.reasons[0]
    undecided = decide_canary(
        CanaryObservation(BinomialCounts(60, 45), BinomialCounts(60, 48), True), thresholds
    )
    assert undecided.verdict is Verdict.FAIL and undecided.restore_routing
    assert "undecided" in undecided.reasons[0]


# --- watch ------------------------------------------------------------------------------


def test_watch_rolls_back_on_regression(thresholds: ThresholdSpec) -> None:
    decision = decide_watch(
        WatchObservation(BinomialCounts(500, 400), BinomialCounts(80, 40), False), thresholds
    )
    assert decision.verdict is Verdict.ROLLBACK and decision.rollback and not decision.passed
    assert decision.evidence["baseline"]["success_rate"] == 0.8
    assert decision.evidence["promoted"]["episodes"] == 80
    assert "regression after promotion" in decision.reasons[0]
    assert_json(decision)


def test_watch_keeps_watching_then_passes_without_regression(
    thresholds: ThresholdSpec,
) -> None:
    baseline = BinomialCounts(500, 400)
    ongoing = decide_watch(WatchObservation(baseline, BinomialCounts(80, 66), False), thresholds)
    assert ongoing.verdict is Verdict.CONTINUE and not ongoing.rollback
    done = decide_watch(WatchObservation(baseline, BinomialCounts(200, 162), True), thresholds)
    assert done.verdict is Verdict.PASS and done.passed


def test_watch_does_not_roll_back_before_min_samples(thresholds: ThresholdSpec) -> None:
    decision = decide_watch(
        WatchObservation(BinomialCounts(500, 400), BinomialCounts(49, 0), False), thresholds
    )
    assert decision.verdict is Verdict.CONTINUE
    assert "min_samples is 50" in decision.reasons[0]


# --- audit and approval -----------------------------------------------------------------


def person(user: str, role: str, decision: str, comment: str = "looks right",
           kind: DecisionKind | None = None) -> HumanDecision:
    """A decision as ``load_decision`` returns it: of the kind its verb belongs to."""
    kind = kind or (DecisionKind.AUDIT if decision == "sign" or role == "auditor"
                    else DecisionKind.APPROVAL)
    return HumanDecision(id="d-1", kind=kind, subject="p-1", decision=decision,
                         comment=comment, details={}, user=user, roles=(role,))


def test_audit_and_approval_by_different_people_pass() -> None:
    audit = decide_human(person("carol", "auditor", "sign"), gate=Gate.AUDIT, submitter="alice")
    assert audit.passed and audit.evidence["user"] == "carol"
    approval = decide_human(
        person("olga", "operator", "approve"), gate=Gate.APPROVAL, submitter="alice",
        auditor="carol",
    )
    assert approval.passed and approval.gate == "approval"
    rejected = decide_human(
        person("olga", "operator", "reject", "canary too short"), gate=Gate.APPROVAL,
        submitter="alice", auditor="carol",
    )
    assert not rejected.passed and "canary too short" in rejected.reasons[0]


@pytest.mark.parametrize("user", ["alice", " Alice "])
def test_submitter_can_neither_audit_nor_approve(user: str) -> None:
    with pytest.raises(HumanDecisionError, match="submitted the training run"):
        decide_human(person(user, "auditor", "sign"), gate=Gate.AUDIT, submitter="alice")
    with pytest.raises(HumanDecisionError, match="submitted the training run"):
        decide_human(person(user, "operator", "approve"), gate=Gate.APPROVAL,
                     submitter="alice", auditor="carol")


def test_auditor_who_signed_cannot_approve() -> None:
    with pytest.raises(HumanDecisionError, match="signed the audit"):
        decide_human(person("CAROL", "operator", "approve"), gate=Gate.APPROVAL,
                     submitter="alice", auditor="carol")


@pytest.mark.parametrize(
    ("decision", "match"),
    [
        (person("olga", "operator", "approve", comment=""), "needs a comment"),
        (person("olga", "operator", "reject", comment="  "), "needs a comment"),
        (person("olga", "operator", "sign"), "unknown approval decision"),
        (person("olga", "auditor", "approve"), "lacks the 'operator' role"),
        (person("", "operator", "approve"), "signed-in user"),
        # An audit's verb recorded as an approval's is no approval decision either.
        (person("olga", "operator", "sign", kind=DecisionKind.APPROVAL),
         "unknown approval decision 'sign'"),
    ],
)
def test_invalid_approval_is_refused(decision: HumanDecision, match: str) -> None:
    with pytest.raises(HumanDecisionError, match=match):
        decide_human(decision, gate=Gate.APPROVAL, submitter="alice", auditor="carol")


def test_human_decisions_refused_out_of_turn() -> None:
    with pytest.raises(HumanDecisionError, match="no signed audit"):
        decide_human(person("olga", "operator", "approve"), gate=Gate.APPROVAL,
                     submitter="alice", auditor=None)
    with pytest.raises(HumanDecisionError, match="at gate 'canary'"):
        refuse_out_of_turn(Gate.APPROVAL, awaiting="canary")
    with pytest.raises(HumanDecisionError, match="needs a comment"):
        decide_human(person("carol", "auditor", "reject", comment=""), gate=Gate.AUDIT,
                     submitter="alice")


# --- gate order -------------------------------------------------------------------------


def test_gate_order_and_next_gate() -> None:
    assert GATE_ORDER == ("stability", "offline_eval", "shadow", "canary", "audit", "approval",
                          "promote", "watch")
    assert next_gate({}) == "stability"
    assert next_gate({"stability": True, "offline_eval": True, "shadow": True}) == "canary"
    assert next_gate(dict.fromkeys(GATE_ORDER, True)) is None
    assert next_gate({"stability": True, "offline_eval": True, "shadow": False}) is None
    assert failed_gate({"stability": True, "offline_eval": True, "shadow": False}) == "shadow"
    assert failed_gate(dict.fromkeys(GATE_ORDER, True)) is None


def test_next_gate_refuses_impossible_histories() -> None:
    with pytest.raises(GateOrderError, match="'shadow' has no result"):
        next_gate({"stability": True, "offline_eval": True, "canary": True})
    with pytest.raises(GateOrderError, match="'stability' has no result"):
        next_gate({"offline_eval": True})
    with pytest.raises(GateOrderError, match="failed, yet"):
        next_gate({"stability": True, "offline_eval": False, "shadow": True})
    with pytest.raises(GateOrderError, match="unknown gates"):
        next_gate({"deploy": True})


def test_results_from_decisions_ignores_continue(thresholds: ThresholdSpec) -> None:
    waiting = decide_canary(
        CanaryObservation(BinomialCounts(1, 1), BinomialCounts(1, 1), False), thresholds
    )
    passed = GateDecision(gate="offline_eval", passed=True, reasons=[], evidence={},
                          verdict=Verdict.PASS)
    stable = GateDecision(gate="stability", passed=True, reasons=[], evidence={},
                          verdict=Verdict.PASS)
    results = results_from_decisions([stable, passed, waiting])
    assert results == {"stability": True, "offline_eval": True}
    assert next_gate(results) == "shadow"
    with pytest.raises(GateOrderError, match="contradicts"):
        GateDecision(gate="shadow", passed=True, reasons=[], evidence={}, verdict=Verdict.FAIL)


# --- durations --------------------------------------------------------------------------


def test_durations_days_in_production_seconds_in_tests() -> None:
    prod, fast = PromotionTiming.for_profile("production"), PromotionTiming.for_profile("test")
    assert prod.canary_soak_s >= 86_400 and prod.watch_period_s >= 86_400
    assert fast.canary_soak_s == 3
    with pytest.raises(ValueError, match="canary_check_interval_s"):
        PromotionTiming(canary_soak_s=10, canary_check_interval_s=20)
    with pytest.raises(ValueError):
        PromotionTiming(canary_share=0.9)


def test_one_timing_per_profile_and_nothing_else() -> None:
    """The worker's profiles are ``PromotionTiming``'s own: minutes for the demo, and an
    unknown profile is refused rather than read as production."""
    demo = PromotionTiming.for_profile("demo")
    assert 60 <= demo.canary_soak_s + demo.shadow_soak_s < 3600
    assert demo.slot_wait_interval_s == demo.canary_check_interval_s
    with pytest.raises(ValueError, match="unknown gate profile"):
        PromotionTiming.for_profile("staging")
    with pytest.raises(ValueError, match="eval_timeout_s must be greater than 0"):
        PromotionTiming(eval_timeout_s=0)


def test_watch_rolls_back_against_the_candidates_own_canary_baseline() -> None:
    from governance_loop.gates import BinomialCounts, decide_watch_against_baselines

    spec = ThresholdSpec.from_mapping(
        {"version": "t@v1", "min_success_rate": 0.0, "max_regression_vs_production": 1.0,
         "min_samples": 1, "watch": {"min_samples": 20, "regression_to_detect": 0.2}}
    )
    # Production before was poor (0/40); the candidate earned promotion at 24/40 in canary.
    baselines = {
        "previous production": BinomialCounts(40, 0),
        "candidate during canary": BinomialCounts(40, 24),
    }
    regressed = decide_watch_against_baselines(
        baselines, BinomialCounts(60, 3), period_complete=False, thresholds=spec
    )
    assert regressed.rollback
    assert regressed.reasons and all(
        r.startswith("baseline 'candidate during canary': regression after promotion")
        for r in regressed.reasons)
    assert set(regressed.evidence["baselines"]) == set(baselines)

    holding = decide_watch_against_baselines(
        baselines, BinomialCounts(60, 35), period_complete=True, thresholds=spec
    )
    assert holding.passed and not holding.rollback


def test_watch_rolls_back_on_a_reward_regression_that_success_rate_misses() -> None:
    from governance_loop.gates import (
        BinomialCounts,
        RewardSummary,
        WatchObservation,
        decide_watch,
    )

    spec = ThresholdSpec.from_mapping(
        {"version": "t@v2", "min_success_rate": 0.0, "max_regression_vs_production": 1.0,
         "min_samples": 1,
         "watch": {"min_samples": 20, "regression_to_detect": 0.2, "max_reward_regression": 0.1}}
    )
    rare = BinomialCounts(40, 1)
    observation = WatchObservation(
        baseline=rare, promoted=BinomialCounts(40, 0), period_complete=False,
        baseline_reward=RewardSummary(40, -0.30, 0.04),
        promoted_reward=RewardSummary(40, -0.95, 0.01),
    )
    decision = decide_watch(observation, spec)
    assert decision.rollback
    assert "mean reward fell" in decision.reasons[0]
    reward = decision.evidence["metrics"][1]
    assert reward["metric"] == "mean reward" and reward["shortfall"] > 0.1
    assert reward["log_evidence_regressed"] >= decision.evidence["rollback_boundary"]

    steady = WatchObservation(
        baseline=rare, promoted=BinomialCounts(40, 1), period_complete=True,
        baseline_reward=RewardSummary(40, -0.30, 0.04),
        promoted_reward=RewardSummary(40, -0.32, 0.04),
    )
    assert decide_watch(steady, spec).passed


def test_negative_reward_tolerance_is_refused() -> None:
    with pytest.raises(ThresholdSpecError):
        ThresholdSpec.from_mapping(
            {"version": "t@v3", "min_success_rate": 0.0, "max_regression_vs_production": 1.0,
             "min_samples": 1, "watch": {"max_reward_regression": -1}}
        )


def test_stored_threshold_rows_without_the_new_fields_stay_valid() -> None:
    stored = {"version": "t@old", "min_success_rate": 0.5, "max_regression_vs_production": 0.1,
              "min_samples": 8,
              "canary": {"min_samples_per_arm": 10, "regression_to_detect": 0.3,
                         "false_abort_rate": 0.05, "missed_regression_rate": 0.1},
              "watch": {"min_samples": 10, "regression_to_detect": 0.3,
                        "false_rollback_rate": 0.05, "max_reward_regression": None}}
    spec = ThresholdSpec.from_mapping(stored)
    assert spec.canary.reward_regression_to_detect is None
    assert spec.watch.missed_regression_rate == 0.10
    assert ThresholdSpec.from_mapping(spec.to_dict()) == spec
    with pytest.raises(ThresholdSpecError, match="reward_regression_to_detect"):
        ThresholdSpec.from_mapping({**stored, "canary": {"reward_regression_to_detect": 0}})
    with pytest.raises(ThresholdSpecError, match="missed_regression_rate"):
        ThresholdSpec.from_mapping({**stored, "watch": {"missed_regression_rate": 1.0}})


def test_a_canary_may_judge_by_reward_alone_when_success_is_too_rare(
    thresholds: ThresholdSpec,
) -> None:
    from dataclasses import replace

    from governance_loop.gates.sequential import RewardSummary

    no_successes = CanaryObservation(
        BinomialCounts(300, 0), BinomialCounts(300, 0), soak_complete=True, look=9,
        canary_reward=RewardSummary(300, -0.50, 0.04),
        production_reward=RewardSummary(300, -0.55, 0.04))
    both = replace(thresholds, canary=replace(thresholds.canary,
                                              reward_regression_to_detect=0.2))
    undecided = decide_canary(no_successes, both)
    assert undecided.verdict is Verdict.FAIL and "without enough information" in \
        undecided.reasons[0]
    reward_only = replace(both, canary=replace(both.canary, check_success_rate=False))
    decided = decide_canary(no_successes, reward_only)
    assert decided.verdict is Verdict.PASS, decided.reasons
    assert [m["metric"] for m in decided.evidence["metrics"]] == ["mean reward"]
    assert decided.evidence["thresholds"]["check_success_rate"] is False
    with pytest.raises(ThresholdSpecError, match="must test at least one metric"):
        CanarySpec(check_success_rate=False)
    stored = {"version": "thr-8", "min_success_rate": 0.0, "max_regression_vs_production": 0.1,
              "min_samples": 10, "canary": {"check_success_rate": False,
                                            "reward_regression_to_detect": 0.2}}
    assert ThresholdSpec.from_mapping(stored).canary == CanarySpec(
        check_success_rate=False, reward_regression_to_detect=0.2)
