"""Offline eval's wait for the verifier: a verifier behind is waited for, a silent one fails
the gate. The clock is the test's own: each poll advances it by the poll interval."""

from __future__ import annotations

import pytest
from temporalio.exceptions import ApplicationError

from governance_loop.activities.evidence import VERIFIER_BEHIND, await_verdicts


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def judging(left: list[list[str]]) -> object:
    """``unjudged_now`` answering each list in turn, then the last one for ever."""
    answers = iter(left)
    last: list[str] = []

    def unjudged_now() -> list[str]:
        nonlocal last
        last = next(answers, last)
        return last
    return unjudged_now


def test_all_judged_within_the_wait_returns_nothing_left() -> None:
    clock = Clock()
    assert await_verdicts(judging([["a", "b"], ["b"], []]), wait_s=1.0, poll_s=0.25,
                          clock=clock, sleep=clock.sleep) == []  # type: ignore[arg-type]


def test_a_verifier_that_judged_nothing_leaves_the_remainder_to_fail_the_gate() -> None:
    clock = Clock()
    left = await_verdicts(judging([["a", "b"]]), wait_s=1.0, poll_s=0.25,
                          clock=clock, sleep=clock.sleep)  # type: ignore[arg-type]
    assert left == ["a", "b"] and clock.now >= 1.0


def test_a_verifier_behind_but_judging_is_waited_for_by_a_retry() -> None:
    clock = Clock()
    with pytest.raises(ApplicationError) as raised:
        await_verdicts(judging([["a", "b", "c"], ["b", "c"]]), wait_s=1.0, poll_s=0.25,
                       clock=clock, sleep=clock.sleep)  # type: ignore[arg-type]
    assert raised.value.type == VERIFIER_BEHIND and not raised.value.non_retryable
    assert "1 episodes judged" in str(raised.value) and "2 to go" in str(raised.value)


def test_the_unjudged_reason_names_no_internal_episode_id() -> None:
    from governance_loop.activities.evidence import _unjudged_decision
    from governance_loop.gates.thresholds import ThresholdSpec

    spec = ThresholdSpec(version="t-1", min_success_rate=0.0, max_regression_vs_production=1.0,
                         min_samples=1)
    ids = ["promotion-abc-eval-0123456789ab-candidate-ep-7"]
    decision = _unjudged_decision(spec, ids)
    assert not decision.passed and "1 episodes" in decision.reasons[0]
    assert ids[0] not in decision.reasons[0] and decision.evidence["unjudged"] == ids
