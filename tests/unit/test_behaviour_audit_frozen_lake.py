"""The shortcut audit on real FrozenLake episodes.

Scripted policies play the real environment through the real episode loop (the tiny
tokenizer renders each turn; the policy reads the latest grid from its prompt, as a model
would), and the real verifier replay judges each episode. The honest solver is the
baseline; each shortcut shows up in its own signal, and an honest solver that takes other
(equally short) paths shows nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from execution_loop.environments.registry import load_builtin_contract
from governance_loop.gates import (
    AuditEpisodes,
    BehaviourAuditSpec,
    EpisodeBehaviour,
    audit_behaviour,
)
from tests.frozen_lake_policies import (
    Lake,
    collapsed,
    hole_seeker,
    honest,
    honest_other_way,
    invalid_writer,
    play,
    wanderer,
)
from verifier.replay import replay_and_judge

SEEDS = range(16)  # sixteen different maps: the eval inputs
# Plays a policy on every map; returns the episodes as the audit reads them.
Player = Callable[[Callable[[str], str]], list[EpisodeBehaviour]]


@pytest.fixture(scope="module")
def play_audited() -> Player:
    """Play a policy on every map and judge each episode by the verifier's replay."""
    contract = load_builtin_contract("frozen_lake")

    def episodes(choose: Callable[[str], str]) -> list[EpisodeBehaviour]:
        played = []
        for seed, record in zip(SEEDS, play(choose, SEEDS), strict=True):
            actions = [s.action_text for s in record.steps]
            verdict = replay_and_judge(Lake(contract), seed=seed, actions=actions)
            played.append(EpisodeBehaviour.of(
                task_id="frozen_lake", seed=seed, success=verdict.success, status=record.status,
                failure_reason=record.failure_reason, verdict_details=verdict.details,
                steps=[(s.action_text, s.feedback) for s in record.steps],
                action_tokens=sum(sum(s.action_mask) for s in record.steps)))
        return played

    return episodes


@pytest.fixture(scope="module")
def baseline(play_audited: Player) -> list[EpisodeBehaviour]:
    played = play_audited(honest)
    assert all(e.success for e in played)
    return played


def _flagged(candidate: list[EpisodeBehaviour], baseline: list[EpisodeBehaviour]) -> list[str]:
    return audit_behaviour(AuditEpisodes(candidate, baseline), BehaviourAuditSpec()).flagged


def test_an_honest_candidate_on_other_paths_flags_nothing(play_audited: Player,
        baseline: list[EpisodeBehaviour]) -> None:
    other = play_audited(honest_other_way)
    assert all(e.success for e in other)
    assert [e.actions for e in other] != [e.actions for e in baseline]
    assert _flagged(other, baseline) == []


def test_falling_into_holes_early_is_flagged(play_audited: Player,
        baseline: list[EpisodeBehaviour]) -> None:
    dying = play_audited(hole_seeker)
    assert all(e.verdict_details["verifier"]["reason"] == "fell_in_hole" for e in dying)
    flagged = _flagged(dying, baseline)
    assert "termination/fell_in_hole" in flagged
    assert "termination/goal_not_reached" not in flagged
    assert "action_format/invalid_rate" not in flagged


def test_wandering_to_the_turn_limit_is_flagged(play_audited: Player,
        baseline: list[EpisodeBehaviour]) -> None:
    wandering = play_audited(wanderer)
    assert {(e.status, e.failure_reason) for e in wandering} == {("truncated", "max_turns")}
    flagged = _flagged(wandering, baseline)
    assert {"termination/goal_not_reached", "length/mean_turns",
            "length/mean_action_tokens"} <= set(flagged)
    assert "termination/fell_in_hole" not in flagged


def test_invalid_moves_are_flagged(play_audited: Player,
        baseline: list[EpisodeBehaviour]) -> None:
    invalid = play_audited(invalid_writer)
    flagged = _flagged(invalid, baseline)
    assert "action_format/invalid_rate" in flagged
    audit = audit_behaviour(AuditEpisodes(invalid, baseline), BehaviourAuditSpec())
    rate = next(s for s in audit.signals if s.name == "action_format/invalid_rate")
    assert rate.candidate == 1.0 and rate.baseline == 0.0


def test_one_answer_whatever_the_map_is_flagged(play_audited: Player,
        baseline: list[EpisodeBehaviour]) -> None:
    same = play_audited(collapsed)
    flagged = _flagged(same, baseline)
    assert "answers/distinct_ratio" in flagged
    # The honest baseline's answers differ from map to map; the collapsed ones barely do.
    audit = audit_behaviour(AuditEpisodes(same, baseline), BehaviourAuditSpec())
    distinct = next(s for s in audit.signals if s.name == "answers/distinct_ratio")
    assert distinct.baseline is not None and distinct.candidate is not None
    assert distinct.baseline > 0.8 > 0.5 > distinct.candidate
