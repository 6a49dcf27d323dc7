"""Task admission: the four questions answered from recorded evidence.

1. reproducible: every reset with the same seed gives the same observation hash
   (at least ``min_resets`` resets);
2. verifiable: the outcome is checked outside the agent, by a verifier that ran
   in its own process and is pinned by a sha256 (matching the pin, when given),
   and that paid nothing for any known reward hack the execution loop played
   against it (``execution_loop.reward_hacks``); a hack that does not apply to the
   environment is listed as not applicable, with the reason;
3. cheap recovery: the slowest reset finishes within ``max_reset_seconds``
   (the worst case, because recovery after a mistake is what training pays for);
4. repeatable: the reference solution succeeds k of k times.

The workflow gathers the evidence; this module only judges it. An operator still
admits or rejects, and only an admissible task can be admitted.

A task set is admitted as one unit: the same questions are answered on a seeded sample of
its tasks (``sample_tasks``; ``set_sample`` of them, all when the set is that small), and the
set is admissible only when every sampled task is.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from triloop.workflow_api import RewardHackTrial

_SHA256 = re.compile(r"^(sha256:)?[0-9a-f]{64}$")


class AdmissionBudgetError(ValueError):
    """Admission budgets that cannot be met by any evidence."""


@dataclass(frozen=True)
class AdmissionBudgets:
    """What the evidence must show; part of governance's configuration."""

    # Seconds: the slowest observed reset must take at most this long.
    max_reset_seconds: float = 30.0
    # Resets with the same seed whose observation hashes must all agree.
    min_resets: int = 2
    # k: reference-solution runs that must all succeed.
    repeat_k: int = 3
    # Tasks of a task set probed for its admission (all of them when it has no more).
    set_sample: int = 8

    def __post_init__(self) -> None:
        if not (math.isfinite(self.max_reset_seconds) and self.max_reset_seconds > 0):
            raise AdmissionBudgetError(
                f"max_reset_seconds must be a positive number, got {self.max_reset_seconds!r}"
            )
        if self.min_resets < 2:
            raise AdmissionBudgetError(
                f"min_resets must be >= 2 (one reset proves nothing), got {self.min_resets}"
            )
        if self.repeat_k < 1:
            raise AdmissionBudgetError(f"repeat_k must be >= 1, got {self.repeat_k}")
        # Bounded: every sampled task's probe evidence travels in one workflow's history.
        if not 1 <= self.set_sample <= MAX_SET_SAMPLE:
            raise AdmissionBudgetError(
                f"set_sample must be between 1 and {MAX_SET_SAMPLE}, got {self.set_sample}")


MAX_SET_SAMPLE = 64


def sample_seed(task_set_id: str) -> int:
    """The seed of a task set's admission sample: fixed by its id (its content), so anyone
    can draw the same sample again from the evidence."""
    return int(task_set_id[:8], 16)


def sample_tasks(task_ids: Sequence[str], *, seed: int, size: int) -> list[str]:
    """``size`` of the set's tasks (given in ordinal order) drawn with ``seed``, in ordinal
    order; every task when the set has no more than ``size``."""
    if len(task_ids) <= size:
        return list(task_ids)
    chosen = set(random.Random(seed).sample(range(len(task_ids)), size))
    return [t for i, t in enumerate(task_ids) if i in chosen]


@dataclass(frozen=True)
class AdmissionEvidence:
    """What the admission workflow observed for one task (environment version + seed)."""

    # Observation hash after each reset with the task's seed.
    reset_fingerprints: list[str]
    # sha256 of the verifier that judged the reference runs; None if none ran.
    verifier_hash: str | None
    # True when the verifier ran in a process separate from the agent's.
    verifier_ran_out_of_process: bool
    # Wall-clock seconds of each reset.
    reset_seconds: list[float]
    # Verifier verdict for each reference-solution run.
    reference_results: list[bool]
    # The verifier hash the environment version pins; None when it pins none.
    pinned_verifier_hash: str | None = None
    # Each known reward hack tried against the verifier; None: no probe was run.
    reward_hacks: list[RewardHackTrial] | None = None


@dataclass(frozen=True)
class AdmissionAssessment:
    """The answer to each question, whether the task may be admitted, and why."""

    reproducible: bool
    verifiable: bool
    cheap_recovery: bool
    repeatable: bool
    admissible: bool
    # One line per question, starting with its name and "ok" or "failed".
    reasons: list[str]
    # Budgets used and the numbers behind the answers, JSON-ready.
    evidence: dict[str, Any]


def _reproducible(ev: AdmissionEvidence, budgets: AdmissionBudgets) -> tuple[bool, str]:
    prints = ev.reset_fingerprints
    distinct = sorted(set(prints))
    if len(prints) < budgets.min_resets:
        return False, (
            f"reproducible: failed, {len(prints)} reset(s) recorded, "
            f"{budgets.min_resets} needed to compare"
        )
    if any(not p for p in prints):
        return False, "reproducible: failed, a reset produced an empty observation hash"
    if len(distinct) > 1:
        return False, (
            f"reproducible: failed, {len(prints)} resets with the same seed gave "
            f"{len(distinct)} different observation hashes"
        )
    return True, f"reproducible: ok, {len(prints)} resets gave observation hash {distinct[0]}"


def _verifiable(ev: AdmissionEvidence) -> tuple[bool, str]:
    if ev.verifier_hash is None:
        return False, "verifiable: failed, no verifier ran, so success is the agent's word"
    if not _SHA256.match(ev.verifier_hash):
        return False, (
            f"verifiable: failed, verifier hash {ev.verifier_hash!r} is not a sha256 digest"
        )
    if not ev.verifier_ran_out_of_process:
        return False, (
            "verifiable: failed, the verifier ran inside the agent's process; "
            "it must run in its own"
        )
    if ev.pinned_verifier_hash is not None and ev.pinned_verifier_hash != ev.verifier_hash:
        return False, (
            f"verifiable: failed, verifier hash {ev.verifier_hash} differs from the pinned "
            f"{ev.pinned_verifier_hash}"
        )
    if ev.reward_hacks is None:
        return False, (
            "verifiable: failed, no reward-hack probe was run, so nobody tried to fool the "
            "verifier"
        )
    rewarded = [t.hack for t in ev.reward_hacks if t.rewarded]
    if rewarded:
        return False, (
            f"verifiable: failed, the verifier rewarded known reward hack(s) "
            f"{', '.join(rewarded)} with the bugs unfixed"
        )
    tried = [t.hack for t in ev.reward_hacks if t.applicable]
    skipped = len(ev.reward_hacks) - len(tried)
    return True, (
        f"verifiable: ok, out-of-process verifier {ev.verifier_hash}; it rewarded none of "
        f"{len(tried)} reward hack(s) tried ({skipped} not applicable)"
    )


def _cheap_recovery(ev: AdmissionEvidence, budgets: AdmissionBudgets) -> tuple[bool, str]:
    times = ev.reset_seconds
    if not times:
        return False, "cheap_recovery: failed, no reset was timed"
    if any(not math.isfinite(t) or t < 0 for t in times):
        return False, f"cheap_recovery: failed, invalid reset times {times}"
    slowest = max(times)
    budget = budgets.max_reset_seconds
    if slowest > budget:
        return False, (
            f"cheap_recovery: failed, slowest reset took {slowest:.3g}s, budget is {budget:.3g}s"
        )
    return True, f"cheap_recovery: ok, slowest of {len(times)} resets took {slowest:.3g}s"


def _repeatable(ev: AdmissionEvidence, budgets: AdmissionBudgets) -> tuple[bool, str]:
    results = ev.reference_results
    k = budgets.repeat_k
    wins = sum(1 for r in results if r)
    if len(results) < k:
        return False, f"repeatable: failed, {len(results)} reference run(s), k={k} needed"
    if wins != len(results):
        return False, (
            f"repeatable: failed, reference solution succeeded {wins} of {len(results)} "
            "runs; every run must succeed"
        )
    return True, f"repeatable: ok, reference solution succeeded {wins} of {len(results)} runs"


def assess_admission(
    evidence: AdmissionEvidence, budgets: AdmissionBudgets | None = None
) -> AdmissionAssessment:
    """Answer the four admission questions from the evidence."""
    budgets = budgets or AdmissionBudgets()
    reproducible, r1 = _reproducible(evidence, budgets)
    verifiable, r2 = _verifiable(evidence)
    cheap, r3 = _cheap_recovery(evidence, budgets)
    repeatable, r4 = _repeatable(evidence, budgets)
    times = [t for t in evidence.reset_seconds if math.isfinite(t)]
    return AdmissionAssessment(
        reproducible=reproducible,
        verifiable=verifiable,
        cheap_recovery=cheap,
        repeatable=repeatable,
        admissible=reproducible and verifiable and cheap and repeatable,
        reasons=[r1, r2, r3, r4],
        evidence={
            "budgets": {
                "max_reset_seconds": budgets.max_reset_seconds,
                "min_resets": budgets.min_resets,
                "repeat_k": budgets.repeat_k,
                "set_sample": budgets.set_sample,
            },
            "resets": len(evidence.reset_fingerprints),
            "distinct_fingerprints": len(set(evidence.reset_fingerprints)),
            "slowest_reset_seconds": max(times) if times else None,
            "verifier_hash": evidence.verifier_hash,
            "pinned_verifier_hash": evidence.pinned_verifier_hash,
            "verifier_ran_out_of_process": evidence.verifier_ran_out_of_process,
            "reference_runs": len(evidence.reference_results),
            "reference_successes": sum(1 for r in evidence.reference_results if r),
            "reward_hacks": (
                None if evidence.reward_hacks is None
                else [asdict(t) for t in evidence.reward_hacks]
            ),
        },
    )
