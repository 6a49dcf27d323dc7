"""A loop's refusal reaches a person with the HTTP status its error type calls for.

``web.orchestration.refused`` reads ``ApplicationError.type`` (``ErrorType``) along the
failure's chain and never the text: the same words give different answers under different
types, and words that once meant "forbidden" give a 409 under a type that does not.
"""

from __future__ import annotations

import pytest
from temporalio.exceptions import ActivityError, ApplicationError, RetryState

from triloop.workflow_api import ErrorType
from web.orchestration import refused


def _failure(error_type: str | None, message: str = "refused: the rules say no",
             details: list[object] | None = None) -> ApplicationError:
    return ApplicationError(message, *(details or []), type=error_type, non_retryable=True)


@pytest.mark.parametrize(("error_type", "status"), [
    (ErrorType.POLICY_DENIED, 403),
    (ErrorType.DECISION_REFUSED, 403),
    (ErrorType.POLICY_UNAVAILABLE, 503),
    (ErrorType.GOVERNANCE_REFUSED, 409),
    (ErrorType.PROMOTION_ENDED, 409),
    ("HumanDecisionError", 409),  # an update validator's refusal: not the person's fault
    (None, 409),
])
def test_the_status_follows_the_type(error_type: str | None, status: int) -> None:
    problem = refused("approve on promotion p", _failure(error_type))
    assert problem.status == status
    assert "the rules say no" in problem.detail and "approve on promotion p" in problem.detail


def test_words_about_the_policy_under_another_type_are_no_403() -> None:
    """What the text said used to decide; now a rule of the loop refusing is a 409."""
    problem = refused("x", _failure(ErrorType.GOVERNANCE_REFUSED,
                                    "alice may not approve: the policy forbids it"))
    assert problem.status == 409


def test_an_invalid_request_lists_its_reasons() -> None:
    problem = refused("set threshold t", _failure(
        ErrorType.INVALID_REQUEST, "the spec is invalid", [["min_samples must be > 0"]]))
    assert (problem.status, problem.reasons) == (422, ["min_samples must be > 0"])


def test_the_type_is_found_behind_an_activity_failure() -> None:
    """A workflow that failed on its activity: the typed error is the activity's cause."""
    typed = _failure(ErrorType.POLICY_DENIED, "governance may not roll back")
    activity = ActivityError("activity failed", scheduled_event_id=1, started_event_id=2,
                             identity="w", activity_type="rollback", activity_id="1",
                             retry_state=RetryState.NON_RETRYABLE_FAILURE)
    activity.__cause__ = typed
    problem = refused("roll back production", activity)
    assert problem.status == 403 and "governance may not roll back" in problem.detail


def test_a_refusal_passed_on_by_the_workflow_is_said_once() -> None:
    """Governance's workflow passes its activity's refusal on as ``refused: <it>``, with the
    activity's failure and then the refusal itself as causes: the person reads it once."""
    reason = "olga's operator role became active after this promotion opened"
    inner = _failure(ErrorType.GOVERNANCE_REFUSED, reason)
    activity = ActivityError("activity task failed", scheduled_event_id=1, started_event_id=2,
                             identity="w", activity_type="record_human_decision",
                             activity_id="1", retry_state=RetryState.NON_RETRYABLE_FAILURE)
    activity.__cause__ = inner
    outer = _failure(ErrorType.DECISION_REFUSED, f"refused: {reason}")
    outer.__cause__ = activity
    problem = refused("the approval decision", outer)
    assert problem.status == 403
    assert problem.detail.count(reason) == 1, problem.detail
    assert "activity task failed" not in problem.detail
