"""Stability gate: a candidate whose run alarmed lately waits for an operator's override.

The learning loop's stability monitors raise two alarms that say the policy stopped
learning from its inputs: ``echo_trap`` (reward flat while variance and entropy fall)
and ``template_collapse`` (answers no longer depend on the prompt). Reward can still
rise meanwhile, so the offline eval may well pass such a candidate.

Rule, for a candidate proposed at iteration i with window K
(``stability.alarm_window_iterations``):

    mismatch  iff the alarms the proposal carries (its row's evidence and the
              workflow's input) differ from the run's recorded alarms up to i
              -> fail; no override: the evidence itself is wrong, propose again
    blocked   iff a recorded echo_trap or template_collapse alarm has an iteration
              in (i - K, i]  -> wait for an operator's override (or fail at the
              deadline)
    pass      otherwise

The recorded alarms (``training_step.alarms``, written by the learning loop in the same
transaction as the iteration) are the truth; the proposal's copies are only compared.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from governance_loop.gates.decision import GateDecision, Verdict
from governance_loop.gates.thresholds import ThresholdSpec
from triloop.statuses import Gate

BLOCKING_ALARMS = frozenset({"echo_trap", "template_collapse"})


@dataclass(frozen=True, order=True)
class RecordedAlarm:
    """A stability alarm at an iteration of the candidate's run."""

    iteration: int
    kind: str

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form for evidence."""
        return {"iteration": self.iteration, "kind": self.kind}


@dataclass(frozen=True)
class StabilityCheck:
    """The gate's decision, and whether an operator may override it."""

    decision: GateDecision
    # True while a blocking alarm waits for an operator (the decision is ``continue``).
    blocked: bool
    alarms: tuple[RecordedAlarm, ...]


def _listed(alarms: Iterable[RecordedAlarm]) -> list[dict[str, object]]:
    return [a.to_dict() for a in sorted(set(alarms))]


def decide_stability(
    *,
    recorded: Iterable[RecordedAlarm],
    proposal_evidence: Iterable[RecordedAlarm],
    proposal_input: Iterable[RecordedAlarm],
    proposed_iteration: int,
    thresholds: ThresholdSpec,
) -> StabilityCheck:
    """Judge the run's recorded alarms against the window and the proposal's copies.

    A proposal made before proposals carried alarms carries none: that agrees with a run
    that recorded none, and is a mismatch for one that did.
    """
    version = thresholds.version
    window = thresholds.stability.alarm_window_iterations
    truth = sorted({a for a in recorded if a.iteration <= proposed_iteration})
    evidence: dict[str, object] = {
        "threshold_version": version,
        "thresholds": {"alarm_window_iterations": window},
        "proposed_iteration": proposed_iteration,
        "recorded_alarms": _listed(truth),
    }
    mismatches = [
        f"the proposal's {where} lists alarms {_listed(copy)}, the run recorded {_listed(truth)}"
        for where, copy in (("evidence", proposal_evidence), ("workflow input", proposal_input))
        if sorted(set(copy)) != truth
    ]
    if mismatches:
        return StabilityCheck(GateDecision(
            gate=Gate.STABILITY, passed=False, verdict=Verdict.FAIL,
            reasons=[*mismatches, "the proposal misstates its run's stability alarms; it "
                     "cannot be overridden: propose the checkpoint again"],
            evidence={**evidence, "mismatch": True},
        ), blocked=False, alarms=tuple(truth))
    recent = [a for a in truth
              if a.kind in BLOCKING_ALARMS and a.iteration > proposed_iteration - window]
    evidence["blocking_alarms"] = _listed(recent)
    if recent:
        named = ", ".join(f"{a.kind.replace('_', ' ')} at iteration {a.iteration}"
                          for a in recent)
        return StabilityCheck(GateDecision(
            gate=Gate.STABILITY, passed=False, verdict=Verdict.CONTINUE,
            reasons=[f"the run raised {named}, within the last {window} iterations before "
                     f"iteration {proposed_iteration} (thresholds {version}); an operator who "
                     "did not submit the run may override with a written reason"],
            evidence=evidence,
        ), blocked=True, alarms=tuple(truth))
    return StabilityCheck(GateDecision(
        gate=Gate.STABILITY, passed=True, verdict=Verdict.PASS,
        reasons=[f"no echo-trap or template-collapse alarm in the last {window} iterations "
                 f"before iteration {proposed_iteration} (thresholds {version})"],
        evidence=evidence,
    ), blocked=False, alarms=tuple(truth))
