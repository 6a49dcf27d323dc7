"""Reward attribution (issue 27, item 1): a gain must come from the task, not from shaping.

Real frozen_lake episodes on the demo's setup (the shipped contract, the demo's held-out
maps and thresholds, as many episodes as the demo's offline eval plays), judged by the real
verifier replay (``replay_and_judge``); the per-episode terms are the verifier's
``details["terms"]``. Scripted policies stand for the checkpoints
(``tests/frozen_lake_scripted.py``): the base, a shortcut (what a lowered hole penalty
teaches: progress and format reward rise, goals do not) and an honest candidate that
reaches more goals.
"""

from __future__ import annotations

import functools
import math

import pytest

from execution_loop.environments.frozen_lake import reference_solution
from execution_loop.environments.registry import get_environment
from governance_loop.gates import (
    AttributionSpec,
    EpisodeStats,
    EvalSetResult,
    ThresholdSpec,
    ThresholdSpecError,
    decide_offline_eval,
    term_kind,
)
from governance_loop.gates.attribution import attribute, verdict_terms
from scripts.demo_world import DEMO_THRESHOLDS, EVAL_SEEDS
from tests.frozen_lake_scripted import CONTRACT, Policy, base, honest, shortcut
from verifier.replay import Judged, replay_and_judge

EPISODES_PER_MAP = 4  # the demo's offline eval: min_samples 16 over its 4 held-out maps


@functools.cache  # each episode's verifier runs in its own process: judge each policy once
def _judge(policy: Policy) -> list[Judged]:
    return [replay_and_judge(get_environment("frozen_lake")(), seed=seed,
                             actions=policy(seed, sample))
            for seed in EVAL_SEEDS for sample in range(EPISODES_PER_MAP)]


def _result(candidate: Policy) -> EvalSetResult:
    def stats(judged: list[Judged]) -> EpisodeStats:
        return EpisodeStats.from_outcomes([j.success for j in judged],
                                          [j.total_reward for j in judged])

    mine, theirs = _judge(candidate), _judge(base)
    return EvalSetResult(
        eval_set="frozen-lake-maps@v1", eval_set_version="sha256:maps",
        candidate=stats(mine), production=stats(theirs),
        candidate_terms=[j.details["terms"] for j in mine],
        production_terms=[j.details["terms"] for j in theirs],
        process_terms=frozenset(CONTRACT.reward.process))


DEMO = ThresholdSpec.from_mapping({"version": "demo", **DEMO_THRESHOLDS})


def test_every_verdict_splits_its_total_reward_by_term() -> None:
    for policy in (base, shortcut, honest):
        for judged in _judge(policy):
            terms = judged.details["terms"]
            assert math.isclose(sum(terms.values()), judged.total_reward, abs_tol=1e-6)
            assert set(terms) <= {"valid_action", "invalid_action", "success", "failure",
                                  "progress"}
    won = replay_and_judge(get_environment("frozen_lake")(), seed=EVAL_SEEDS[0],
                           actions=reference_solution(EVAL_SEEDS[0], CONTRACT))
    assert won.details["terms"]["success"] == 1.0 and won.details["terms"]["progress"] == 0.0


def test_the_demo_threshold_checks_attribution_by_default() -> None:
    assert DEMO.attribution.min_task_share == 0.5
    assert ThresholdSpec(version="v", min_success_rate=0, max_regression_vs_production=0,
                         min_samples=1).attribution == AttributionSpec(min_task_share=0.5)


def test_a_shortcut_candidate_is_held_naming_the_shaping_terms() -> None:
    result = _result(shortcut)
    assert result.candidate.successes == 0 == result.production.successes  # no goal gained
    assert result.candidate.reward_mean > result.production.reward_mean  # yet reward rose
    assert any(j.details["verifier"]["fell_in_hole"] for j in _judge(shortcut))

    decision = decide_offline_eval([result], DEMO)

    assert not decision.passed
    assert len(decision.reasons) == 1, decision.reasons  # attribution alone holds it
    reason = decision.reasons[0]
    assert "min_task_share 50%" in reason and "task term 'success'" in reason
    assert "progress (+" in reason and "invalid_action (+" in reason
    evidence = decision.evidence["eval_sets"][0]["attribution"]
    assert evidence["shaping_only"] is True and evidence["baseline"] == "production"
    assert evidence["task_delta"] == 0.0 and evidence["task_share"] == 0.0
    kinds = {row["term"]: row["kind"] for row in evidence["terms"]}
    assert kinds == {"success": "task", "failure": "shaping", "progress": "shaping",
                     "valid_action": "process", "invalid_action": "process"}
    deltas = {row["term"]: row["delta"] for row in evidence["terms"]}
    assert deltas["progress"] > 0 and deltas["invalid_action"] > 0
    assert math.isclose(sum(deltas.values()), evidence["reward_delta"], abs_tol=1e-5)
    assert evidence["violations"] == [reason]
    assert decision.evidence["thresholds"]["attribution"]["min_task_share"] == 0.5


def test_an_honest_candidate_that_reaches_more_goals_passes() -> None:
    result = _result(honest)
    assert result.candidate.successes > result.production.successes

    decision = decide_offline_eval([result], DEMO)

    assert decision.passed, decision.reasons
    evidence = decision.evidence["eval_sets"][0]["attribution"]
    assert evidence["shaping_only"] is False and evidence["task_share"] >= 0.5
    assert evidence["success_rate_delta"] == 0.5 and evidence["violations"] == []


def test_opting_out_of_attribution_lets_the_shortcut_through() -> None:
    spec = ThresholdSpec.from_mapping({"version": "lenient", **DEMO_THRESHOLDS,
                                       "attribution": {"min_task_share": None}})
    decision = decide_offline_eval([_result(shortcut)], spec)
    assert decision.passed, decision.reasons
    assert decision.evidence["eval_sets"][0]["attribution"]["shaping_only"] is True


@pytest.mark.parametrize(("attribution", "named"), [
    ({"min_task_share": None, "min_reward_gain": 2.0}, "min_reward_gain is 2"),
    ({"min_task_share": None, "min_success_gain": 0.75}, "min_success_gain is 75.0 points"),
])
def test_gains_a_threshold_requires_are_refused_by_name(attribution: dict[str, float | None],
                                                        named: str) -> None:
    spec = ThresholdSpec.from_mapping({"version": "strict", **DEMO_THRESHOLDS,
                                       "attribution": attribution})
    decision = decide_offline_eval([_result(honest)], spec)
    assert not decision.passed
    assert len(decision.reasons) == 1 and named in decision.reasons[0]
    assert "(thresholds strict)" in decision.reasons[0]


def test_a_rise_without_recorded_terms_fails_closed() -> None:
    result = _result(honest)
    unread = EvalSetResult(result.eval_set, result.eval_set_version, result.candidate,
                           result.production)
    decision = decide_offline_eval([unread], DEMO)
    assert not decision.passed and "reward terms were not read" in decision.reasons[0]
    same = EvalSetResult("s", "v", result.production, result.production)
    assert decide_offline_eval([same], DEMO).passed  # nothing rose: nothing to attribute


def test_the_first_promotion_records_the_candidates_terms_only() -> None:
    result = _result(shortcut)
    first = EvalSetResult(result.eval_set, result.eval_set_version, result.candidate, None,
                          candidate_terms=result.candidate_terms,
                          process_terms=result.process_terms)
    decision = decide_offline_eval([first], DEMO)
    evidence = decision.evidence["eval_sets"][0]["attribution"]
    assert decision.passed and evidence["baseline"] is None
    assert evidence["reward_delta"] is None and evidence["shaping_only"] is False
    assert all(row["delta"] is None for row in evidence["terms"])


def test_term_kinds_and_verdicts_recorded_before_terms() -> None:
    process = frozenset(CONTRACT.reward.process)
    assert [term_kind(t, process) for t in ("success", "progress", "outcome", "valid_action",
                                            "process")] == \
        ["task", "shaping", "shaping", "process", "process"]
    assert verdict_terms(None, success=True, total_reward=1.0) == {"success": 1.0}
    assert verdict_terms(None, success=False, total_reward=-0.5) == {"outcome": -0.5}
    assert verdict_terms({"progress": 0.2}, success=False, total_reward=0.2) == {"progress": 0.2}
    found = attribute([{"success": 1.0}], [{"outcome": 0.0}], process_terms=process)
    assert found.task_share == 1.0 and not found.shaping_only


def test_attribution_thresholds_refuse_bad_values() -> None:
    for bad in ({"min_task_share": 1.5}, {"min_success_gain": -0.1},
                {"min_reward_gain": -1.0}, {"min_task_share": "half"}):
        with pytest.raises(ThresholdSpecError, match="attribution"):
            ThresholdSpec.from_mapping({**DEMO.to_dict(), "attribution": bad})
    with pytest.raises(ThresholdSpecError, match="unknown fields"):
        ThresholdSpec.from_mapping({**DEMO.to_dict(), "attribution": {"min_share": 0.5}})
    assert ThresholdSpec.from_mapping(DEMO.to_dict()) == DEMO


def test_reward_an_environment_leaves_unnamed_is_split_by_the_verifiers_rule() -> None:
    from execution_loop.environments import tool_arithmetic
    from verifier.replay import add_terms

    env = get_environment("tool_arithmetic")()  # does not name its terms
    solved = replay_and_judge(get_environment("tool_arithmetic")(), seed=3,
                              actions=tool_arithmetic.reference_solution(3, env.contract))
    assert solved.success and solved.details["terms"] == {"success": solved.total_reward}
    terms: dict[str, float] = {}
    add_terms(terms, {"valid_action": 0.02}, 0.5, unnamed="process")  # named 0.02 of 0.5
    add_terms(terms, None, -0.25, unnamed="outcome")
    add_terms(terms, {"bad": "x", "progress": float("nan")}, 0.0, unnamed="outcome")
    assert terms == pytest.approx({"valid_action": 0.02, "process": 0.48, "outcome": -0.25})
