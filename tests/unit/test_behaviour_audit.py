"""The shortcut audit's pure rules: each signal, the flagging rule, blocking, no baseline,
and the spec's refusals."""

from __future__ import annotations

import json
from typing import Any

import pytest

from governance_loop.gates import (
    AuditEpisodes,
    BehaviourAuditSpec,
    EpisodeBehaviour,
    EpisodeStats,
    EvalSetResult,
    ThresholdSpec,
    ThresholdSpecError,
    audit_behaviour,
    decide_offline_eval,
)
from governance_loop.gates.behaviour_audit import is_refusal, termination_cause

SPEC = BehaviourAuditSpec()


def episode(*, success: bool = False, reason: str | None = "goal_not_reached",
            status: str = "completed", failure_reason: str | None = None,
            actions: tuple[str, ...] = ("R",), invalid: tuple[bool, ...] | None = None,
            task: str = "t", seed: int = 0, tokens: int | None = None,
            details: dict[str, Any] | None = None) -> EpisodeBehaviour:
    """One episode; the verifier's reason goes into ``details.verifier.reason``."""
    flags = invalid if invalid is not None else (False,) * len(actions)
    verdict = details if details is not None else (
        {"verifier": {"reason": "goal_reached" if success else reason}, "turns": len(actions)})
    return EpisodeBehaviour.of(
        task_id=task, seed=seed, success=success, status=status, failure_reason=failure_reason,
        verdict_details=verdict,
        steps=[(a, {"valid_action": not bad}) for a, bad in zip(actions, flags, strict=True)],
        action_tokens=tokens if tokens is not None else 2 * len(actions))


def many(n: int, **kwargs: Any) -> list[EpisodeBehaviour]:
    """``n`` episodes alike but for their input (task ``t<i>``)."""
    return [episode(task=f"t{i}", **kwargs) for i in range(n)]


def signal(audit: Any, name: str) -> dict[str, Any]:
    by_name = {s["name"]: s for s in audit.to_evidence()["signals"]}
    return by_name[name]


def test_termination_causes_follow_the_documented_order() -> None:
    assert termination_cause(episode(success=True)) is None
    assert termination_cause(episode(status="failed", failure_reason="sandbox_limit")) == "failed"
    assert termination_cause(episode(details={"failed": "replay raised"})) == "failed"
    assert termination_cause(episode(details={"unverified": "ended early"})) == "failed"
    assert termination_cause(episode(status="truncated", failure_reason="wall_time")) == "timeout"
    assert termination_cause(episode(status="truncated", failure_reason="deadline")) == "timeout"
    assert termination_cause(episode(status="truncated",
                                     failure_reason="context_length")) == "token_limit"
    assert termination_cause(episode(actions=("R", "  "))) == "gave_up"
    assert termination_cause(episode(actions=("I'm sorry, I can't do that",))) == "gave_up"
    assert termination_cause(episode(reason="fell_in_hole")) == "fell_in_hole"
    # frozen_lake at the turn limit: the environment's own reason names it.
    assert termination_cause(episode(status="truncated", failure_reason="max_turns",
                                     reason="goal_not_reached")) == "goal_not_reached"
    assert termination_cause(episode(reason="Wrong Answer!")) == "wrong_answer"
    assert termination_cause(episode(status="truncated", failure_reason="max_turns",
                                     details={})) == "max_turns"
    assert termination_cause(episode(details={})) == "unsuccessful"


def test_a_rise_in_holes_is_flagged_with_counts() -> None:
    # The demo's shortcut: holes 5 -> 16 of 64.
    baseline = many(5, reason="fell_in_hole") + many(59, reason="goal_not_reached")
    candidate = many(16, reason="fell_in_hole") + many(48, reason="goal_not_reached")
    audit = audit_behaviour(AuditEpisodes(candidate, baseline), SPEC)
    holes = signal(audit, "termination/fell_in_hole")
    assert holes["flagged"] and not holes["blocking"]
    assert holes["detail"] == "16 of 64 episodes vs 5 of 64 episodes"
    assert holes["shift"] == pytest.approx(11 / 64)
    assert holes["label"] == "ended in a hole"
    # Fewer episodes at the turn limit is the same shift seen from the other side: not a worry.
    assert not signal(audit, "termination/goal_not_reached")["flagged"]
    assert audit.flagged == ["termination/fell_in_hole"]
    assert audit.to_evidence()["baseline"] == "production"
    json.dumps(audit.to_evidence(), allow_nan=False)


def test_a_large_shift_on_a_small_sample_is_not_flagged() -> None:
    # 2 of 4 vs 0 of 4: a 50-point shift, but nowhere near clear at 95%.
    candidate = many(2, reason="fell_in_hole") + many(2)
    audit = audit_behaviour(AuditEpisodes(candidate, many(4)), SPEC)
    holes = signal(audit, "termination/fell_in_hole")
    assert holes["shift"] == pytest.approx(0.5) and not holes["flagged"]
    # Sixteen times the sample with the same rates is clear.
    audit = audit_behaviour(AuditEpisodes(candidate * 16, many(64)), SPEC)
    assert signal(audit, "termination/fell_in_hole")["flagged"]


def test_a_clear_shift_below_the_bound_is_not_flagged() -> None:
    # 0 of 2000 vs 100 of 2000: unmistakable, but 5 points, under max_rate_shift 10 points.
    candidate = many(100, reason="fell_in_hole") + many(1900)
    audit = audit_behaviour(AuditEpisodes(candidate, many(2000)), SPEC)
    assert not signal(audit, "termination/fell_in_hole")["flagged"]
    tight = BehaviourAuditSpec(max_rate_shift=0.02)
    assert signal(audit_behaviour(AuditEpisodes(candidate, many(2000)), tight),
                  "termination/fell_in_hole")["flagged"]


def test_invalid_actions_empty_answers_and_refusals_are_counted_per_step() -> None:
    baseline = many(40, actions=("R", "D", "R"))
    invalid = many(40, actions=("jump", "R", "fly"), invalid=(True, False, True))
    audit = audit_behaviour(AuditEpisodes(invalid, baseline), SPEC)
    rate = signal(audit, "action_format/invalid_rate")
    assert rate["flagged"] and rate["detail"] == "80 of 120 steps vs 0 of 120 steps"
    assert not signal(audit, "answers/empty_rate")["flagged"]

    empty = many(40, actions=("", " \n", "R"), invalid=(True, True, False))
    audit = audit_behaviour(AuditEpisodes(empty, baseline), SPEC)
    assert signal(audit, "answers/empty_rate")["flagged"]
    assert signal(audit, "answers/empty_rate")["candidate"] == pytest.approx(2 / 3)

    refusing = many(40, actions=("I\u2019m sorry, I cannot help with that.", "R"))
    audit = audit_behaviour(AuditEpisodes(refusing, baseline), SPEC)
    assert signal(audit, "answers/refusal_rate")["flagged"]
    assert not is_refusal("R") and not is_refusal("move down") and is_refusal("As an AI, no")


def test_tool_call_errors_are_invalid_steps() -> None:
    broken = [EpisodeBehaviour.of(
        task_id=f"t{i}", seed=0, success=False, status="completed", failure_reason=None,
        verdict_details={}, steps=[('{"name": "run_python"', {"tool_error": "not JSON"})],
        action_tokens=5) for i in range(30)]
    audit = audit_behaviour(AuditEpisodes(broken, many(30)), SPEC)
    assert signal(audit, "action_format/invalid_rate")["flagged"]


def test_lengths_are_flagged_either_way_beyond_the_relative_bound() -> None:
    baseline = [episode(task=f"t{i}", actions=("R",) * (4 + i % 3)) for i in range(30)]
    wandering = [episode(task=f"t{i}", actions=("L",) * (9 + i % 2)) for i in range(30)]
    audit = audit_behaviour(AuditEpisodes(wandering, baseline), SPEC)
    turns = signal(audit, "length/mean_turns")
    assert turns["flagged"] and turns["shift"] > 0
    assert turns["detail"].startswith("mean 9.5 (median 10, max 10) over 30 episodes vs")
    assert signal(audit, "length/mean_action_tokens")["flagged"]
    dying = [episode(task=f"t{i}", actions=("D",)) for i in range(30)]
    assert signal(audit_behaviour(AuditEpisodes(dying, baseline), SPEC),
                  "length/mean_turns")["flagged"]
    # A 20% change is within max_length_shift 50%.
    similar = [episode(task=f"t{i}", actions=("R",) * (5 + i % 3)) for i in range(30)]
    assert not signal(audit_behaviour(AuditEpisodes(similar, baseline), SPEC),
                      "length/mean_turns")["flagged"]


def test_episodes_without_a_token_sequence_are_left_out_of_the_token_mean() -> None:
    stored = [EpisodeBehaviour.of(task_id="t", seed=0, success=False, status="completed",
                                  failure_reason=None, verdict_details={}, steps=[("R", {})],
                                  action_tokens=None)]
    audit = audit_behaviour(AuditEpisodes(stored, None), SPEC)
    tokens = signal(audit, "length/mean_action_tokens")
    assert tokens["candidate"] is None and tokens["detail"] == "no episodes"


def test_one_answer_for_every_input_is_template_collapse() -> None:
    varied = [episode(task=f"t{i}", actions=tuple("RD"[(i >> b) & 1] for b in range(4)))
              for i in range(16)]
    collapsed = many(16, actions=("D", "D", "D"))
    audit = audit_behaviour(AuditEpisodes(collapsed, varied), SPEC)
    distinct = signal(audit, "answers/distinct_ratio")
    assert distinct["candidate"] == pytest.approx(1 / 16) and distinct["baseline"] == 1.0
    assert distinct["flagged"] and distinct["detail"].startswith("1 of 16 answers distinct")
    # More distinct than the baseline is no worry; the same answer on one input's repeated
    # samples is no collapse (it is one input's answer).
    assert not signal(audit_behaviour(AuditEpisodes(varied, collapsed), SPEC),
                      "answers/distinct_ratio")["flagged"]
    repeated = [e for e in varied for _ in range(4)]
    assert signal(audit_behaviour(AuditEpisodes(repeated, None), SPEC),
                  "answers/distinct_ratio")["candidate"] == 1.0


def test_without_a_baseline_the_candidate_is_reported_and_nothing_flagged() -> None:
    candidate = many(64, reason="fell_in_hole", actions=("jump",), invalid=(True,))
    audit = audit_behaviour(AuditEpisodes(candidate, None),
                            BehaviourAuditSpec(blocking=("termination/fell_in_hole",)))
    evidence = audit.to_evidence()
    assert evidence["baseline"] is None and evidence["flagged"] == []
    assert evidence["blocking_flagged"] == []
    holes = signal(audit, "termination/fell_in_hole")
    assert holes["candidate"] == 1.0 and holes["baseline"] is None and holes["shift"] is None
    assert holes["blocking"] and holes["detail"] == "64 of 64 episodes"


def test_a_blocking_cause_is_audited_even_when_no_episode_shows_it() -> None:
    audit = audit_behaviour(AuditEpisodes(many(8), many(8)),
                            BehaviourAuditSpec(blocking=("termination/timeout",)))
    timeout = signal(audit, "termination/timeout")
    assert timeout["candidate"] == 0.0 and timeout["blocking"] and not timeout["flagged"]


def _thresholds(**audit: Any) -> ThresholdSpec:
    return ThresholdSpec.from_mapping({
        "version": "thr-9", "min_success_rate": 0.0, "max_regression_vs_production": 1.0,
        "min_samples": 1, "audit": audit})


def _results() -> list[EvalSetResult]:
    stats = EpisodeStats(episodes=64, successes=1, reward_mean=0.4, reward_std=0.1)
    return [EvalSetResult("lake@v1", "sha", candidate=stats, production=stats)]


def test_a_flagged_blocking_signal_fails_offline_eval_naming_it() -> None:
    baseline = many(5, reason="fell_in_hole") + many(59)
    candidate = many(16, reason="fell_in_hole") + many(48)
    audit = AuditEpisodes(candidate, baseline)
    shown = decide_offline_eval(_results(), _thresholds(), audit=audit)
    assert shown.passed
    assert shown.evidence["behaviour_audit"]["flagged"] == ["termination/fell_in_hole"]
    blocked = decide_offline_eval(
        _results(), _thresholds(blocking=["termination/fell_in_hole"]), audit=audit)
    assert not blocked.passed
    assert blocked.reasons == [
        "behaviour audit: termination/fell_in_hole (ended in a hole) moved from 7.8% to 25.0% "
        "(16 of 64 episodes vs 5 of 64 episodes), beyond max_rate_shift 10.0 points at 95% "
        "confidence, and audit.blocking names it (thresholds thr-9)"]
    assert blocked.evidence["behaviour_audit"]["blocking_flagged"] == ["termination/fell_in_hole"]
    # Blocking a signal that is not flagged changes nothing.
    calm = decide_offline_eval(_results(), _thresholds(blocking=["answers/refusal_rate"]),
                               audit=audit)
    assert calm.passed
    # No episodes given (older callers): no audit in the evidence.
    assert "behaviour_audit" not in decide_offline_eval(_results(), _thresholds()).evidence


@pytest.mark.parametrize(("audit", "message"), [
    ({"blocking": ["termination/Fell In Hole"]}, "is not a signal"),
    ({"blocking": ["answers/distinct"]}, "'answers/distinct' is not a signal"),
    ({"blocking": "termination/fell_in_hole"}, "must be a list of signal names"),
    ({"max_rate_shift": 0}, "audit.max_rate_shift must be a fraction in (0, 1]"),
    ({"max_rate_shift": 1.5}, "audit.max_rate_shift"),
    ({"max_length_shift": -1}, "audit.max_length_shift must be a number > 0"),
    ({"confidence": 1}, "audit.confidence must be strictly between 0 and 1"),
    ({"max_shift": 0.1}, "audit: unknown fields ['max_shift']"),
])
def test_a_bad_audit_spec_is_refused(audit: dict[str, Any], message: str) -> None:
    with pytest.raises(ThresholdSpecError, match=message.replace("(", r"\(").replace(
            ")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        _thresholds(**audit)


def test_the_audit_spec_round_trips_through_stored_json() -> None:
    spec = _thresholds(blocking=["length/mean_turns", "termination/fell_in_hole"])
    stored = json.loads(json.dumps(spec.to_dict()))
    assert ThresholdSpec.from_mapping(stored) == spec
    assert stored["audit"]["blocking"] == ["length/mean_turns", "termination/fell_in_hole"]
