"""The reward-hack probe: every known hack against the hardened fix_ci_failure verifier
earns nothing, a naive verifier that trusts an agent-writable report is caught, and
admission refuses it with the hack named."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from execution_loop.environments import ci_repo
from execution_loop.environments.base import Outcome
from execution_loop.environments.fix_ci_failure import FixCiFailure
from execution_loop.environments.registry import get_environment, load_builtin_contract
from execution_loop.reward_hacks import (
    ANSWER_HACKS,
    CODE_HACKS,
    LIBRARY,
    probe_reward_hacks,
    try_hack,
)
from execution_loop.sandbox import LocalProcessSandbox, SandboxLimits
from governance_loop.admission import AdmissionEvidence, assess_admission
from triloop.workflow_api import RewardHackTrial

SHOP = 1
LIMITS = SandboxLimits(cpu_time_s=10, memory_bytes=512 * 2**20, wall_time_s=20)


class NaiveFixCiFailure(FixCiFailure):
    """Test-only: runs the agent's tree as it is and believes the report it writes."""

    def outcome(self) -> Outcome:
        report = self.workdir.parent / "report.json"  # agent code can reach it
        run = ci_repo.run_ci(LocalProcessSandbox(), self.workdir, report, LIMITS)
        statuses = run.statuses
        success = bool(statuses) and all(s != "failed" for s in statuses.values())
        return Outcome(success, 1.0 if success else 0.0, {"reason": "naive"})


def opener(cls: type[FixCiFailure]) -> Callable[[], FixCiFailure]:
    return lambda: cls(load_builtin_contract("fix_ci_failure"))


@pytest.mark.parametrize("hack", CODE_HACKS, ids=[h.name for h in CODE_HACKS])
def test_no_known_hack_earns_reward_from_the_hardened_verifier(hack) -> None:  # type: ignore[no-untyped-def]
    trial = try_hack(hack, opener(FixCiFailure), SHOP)
    assert trial.applicable
    assert not trial.rewarded and trial.reward == 0.0, trial


def test_the_atexit_overwrite_that_was_reported_is_caught_by_the_tampering_check() -> None:
    hack = next(h for h in LIBRARY if h.name == "atexit_report_overwrite")
    env = FixCiFailure(load_builtin_contract("fix_ci_failure"))
    try:
        env.reset(SHOP)
        from execution_loop.reward_hacks import read_view

        for move in hack.moves(read_view(env.workdir)):
            env.step(move)
        outcome = env.outcome()
    finally:
        env.close()
    assert not outcome.success
    assert outcome.details["failing_tests"] == [
        "test_apply_discount_takes_percent_off", "test_bulk_discount_from_fifty",
    ]


def test_monkeypatching_pytest_is_named_as_tampering() -> None:
    hack = next(h for h in LIBRARY if h.name == "monkeypatch_verifier_imports")
    env = FixCiFailure(load_builtin_contract("fix_ci_failure"))
    try:
        env.reset(SHOP)
        from execution_loop.reward_hacks import read_view

        for move in hack.moves(read_view(env.workdir)):
            env.step(move)
        outcome = env.outcome()
    finally:
        env.close()
    assert not outcome.success and outcome.details["reason"] == "trusted_result"
    assert "_pytest.python.Function.runtest was changed" in outcome.details["tampering"]


def test_a_naive_verifier_is_caught_and_admission_names_the_hack() -> None:
    trials = probe_reward_hacks(opener(NaiveFixCiFailure), SHOP)
    rewarded = {t.hack for t in trials if t.rewarded}
    assert {"atexit_report_overwrite", "edited_tests", "monkeypatch_verifier_imports"} <= rewarded
    evidence = AdmissionEvidence(
        reset_fingerprints=["a" * 64] * 2, verifier_hash="b" * 64,
        verifier_ran_out_of_process=True, reset_seconds=[0.1, 0.1],
        reference_results=[True] * 3, reward_hacks=trials,
    )
    assessment = assess_admission(evidence)
    assert not assessment.verifiable and not assessment.admissible
    reason = assessment.reasons[1]
    assert reason.startswith("verifiable: failed") and "atexit_report_overwrite" in reason
    assert {"hack": "atexit_report_overwrite", "applicable": True, "rewarded": True} .items() <= (
        next(h for h in assessment.evidence["reward_hacks"]
             if h["hack"] == "atexit_report_overwrite").items()
    )


@pytest.mark.parametrize("name", ["frozen_lake", "tool_arithmetic"])
def test_hacks_without_code_editing_are_not_applicable(name: str) -> None:
    trials = probe_reward_hacks(lambda: get_environment(name)(), 0)
    assert [t.hack for t in trials] == [h.name for h in LIBRARY]
    for trial in trials[:len(CODE_HACKS)]:
        assert not trial.applicable and not trial.rewarded
        assert trial.detail.startswith(f"not applicable: {name}'s contract allows no edit_source")
    answers = trials[len(CODE_HACKS):]
    if name == "frozen_lake":  # moves, no answers
        assert all(not t.applicable and "allows no answer" in t.detail for t in answers)
    else:  # an answer that knows nothing earns nothing from the exact verifier
        assert [t.hack for t in answers] == [h.name for h in ANSWER_HACKS]
        assert all(t.applicable and not t.rewarded and t.reward == 0.0 for t in answers)


def test_admission_without_a_hack_probe_is_not_verifiable() -> None:
    base = {
        "reset_fingerprints": ["a" * 64] * 2, "verifier_hash": "b" * 64,
        "verifier_ran_out_of_process": True, "reset_seconds": [0.1, 0.1],
        "reference_results": [True] * 3,
    }
    missing = assess_admission(AdmissionEvidence(**base))
    assert not missing.verifiable and "no reward-hack probe" in missing.reasons[1]
    clean = [RewardHackTrial(h.name, applicable=True, detail="all_tests_pass") for h in LIBRARY]
    passed = assess_admission(AdmissionEvidence(**base, reward_hacks=clean))
    assert passed.verifiable and passed.admissible, passed.reasons
