"""Task admission: each of the four questions fails on its own evidence."""

from __future__ import annotations

import dataclasses
import json

import pytest

from governance_loop.admission import (
    AdmissionBudgetError,
    AdmissionBudgets,
    AdmissionEvidence,
    assess_admission,
)
from triloop.workflow_api import RewardHackTrial

VERIFIER = "a" * 64


@pytest.fixture
def good() -> AdmissionEvidence:
    return AdmissionEvidence(
        reset_fingerprints=["obs-1", "obs-1", "obs-1"],
        verifier_hash=VERIFIER,
        verifier_ran_out_of_process=True,
        reset_seconds=[0.4, 0.6, 0.5],
        reference_results=[True, True, True],
        pinned_verifier_hash=VERIFIER,
        reward_hacks=[RewardHackTrial("atexit_report_overwrite", applicable=True,
                                      detail="all_tests_pass")],
    )


def test_good_evidence_is_admissible(good: AdmissionEvidence) -> None:
    result = assess_admission(good)
    assert result.admissible
    assert all(r.split(":")[1].strip().startswith("ok") for r in result.reasons)
    assert result.evidence["slowest_reset_seconds"] == 0.6
    assert result.evidence["budgets"]["repeat_k"] == 3
    json.dumps(result.evidence, allow_nan=False)


@pytest.mark.parametrize(
    ("change", "question", "message"),
    [
        ({"reset_fingerprints": ["obs-1", "obs-2"]}, "reproducible", "2 different"),
        ({"reset_fingerprints": ["obs-1"]}, "reproducible", "2 needed"),
        ({"reset_fingerprints": ["", ""]}, "reproducible", "empty observation hash"),
        ({"verifier_hash": None, "pinned_verifier_hash": None}, "verifiable", "no verifier"),
        ({"verifier_ran_out_of_process": False}, "verifiable", "agent's process"),
        ({"verifier_hash": "b" * 64}, "verifiable", "differs from the pinned"),
        ({"verifier_hash": "v1", "pinned_verifier_hash": None}, "verifiable", "not a sha256"),
        ({"reset_seconds": [0.5, 31.0]}, "cheap_recovery", "budget is 30s"),
        ({"reset_seconds": []}, "cheap_recovery", "no reset was timed"),
        ({"reset_seconds": [float("nan")]}, "cheap_recovery", "invalid reset times"),
        ({"reference_results": [True, False, True]}, "repeatable", "2 of 3"),
        ({"reference_results": [True, True]}, "repeatable", "k=3 needed"),
    ],
)
def test_each_question_fails_on_its_own(
    good: AdmissionEvidence, change: dict[str, object], question: str, message: str
) -> None:
    result = assess_admission(dataclasses.replace(good, **change))  # type: ignore[arg-type]
    assert not result.admissible
    answers = {
        "reproducible": result.reproducible,
        "verifiable": result.verifiable,
        "cheap_recovery": result.cheap_recovery,
        "repeatable": result.repeatable,
    }
    assert [q for q, ok in answers.items() if not ok] == [question]
    failed = [r for r in result.reasons if "failed" in r]
    assert len(failed) == 1 and failed[0].startswith(f"{question}: failed")
    assert message in failed[0]


def test_budgets_are_configurable(good: AdmissionEvidence) -> None:
    strict = AdmissionBudgets(max_reset_seconds=0.5, repeat_k=5)
    result = assess_admission(good, strict)
    assert not result.cheap_recovery and not result.repeatable
    assert result.reproducible and result.verifiable


def test_impossible_budgets_are_refused() -> None:
    with pytest.raises(AdmissionBudgetError, match="min_resets"):
        AdmissionBudgets(min_resets=1)
    with pytest.raises(AdmissionBudgetError, match="max_reset_seconds"):
        AdmissionBudgets(max_reset_seconds=0)
    with pytest.raises(AdmissionBudgetError, match="repeat_k"):
        AdmissionBudgets(repeat_k=0)


def test_a_task_sets_sample_is_seeded_sized_by_the_budget_and_in_set_order() -> None:
    from governance_loop.admission import sample_seed, sample_tasks

    tasks = [f"t{i:03d}" for i in range(100)]
    seed = sample_seed("0000abcd" + "0" * 56)
    assert seed == 0xABCD
    drawn = sample_tasks(tasks, seed=seed, size=8)
    assert len(drawn) == 8 and len(set(drawn)) == 8 and drawn == sorted(drawn)
    assert drawn == sample_tasks(tasks, seed=seed, size=8)  # drawn again from the evidence
    assert drawn != sample_tasks(tasks, seed=seed + 1, size=8)
    assert sample_tasks(tasks[:5], seed=seed, size=8) == tasks[:5]  # a small set: all of it


@pytest.mark.parametrize("size", [0, 65])
def test_a_set_sample_outside_its_bounds_is_refused(size: int) -> None:
    from governance_loop.admission import AdmissionBudgetError, AdmissionBudgets

    with pytest.raises(AdmissionBudgetError, match="set_sample"):
        AdmissionBudgets(set_sample=size)
