"""What a gate decides, the order gates run in, and which gate comes next."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from triloop.statuses import GATE_ORDER

__all__ = ["GATE_ORDER", "GateDecision", "GateOrderError", "Verdict", "failed_gate",
           "next_gate", "results_from_decisions"]

class Verdict(StrEnum):
    """The outcome of one evaluation of a gate."""

    PASS = "pass"
    FAIL = "fail"
    # Not enough evidence yet: keep soaking and evaluate again later.
    CONTINUE = "continue"
    # Canary regressed: the caller must restore routing to production.
    ABORT_REGRESSION = "abort_regression"
    # Watch found a regression after promotion: the caller must roll back.
    ROLLBACK = "rollback"


class GateOrderError(ValueError):
    """Gate results that could not have come from running the gates in order."""


@dataclass(frozen=True)
class GateDecision:
    """One gate's decision with the reasons and the numbers behind it."""

    gate: str
    passed: bool
    reasons: list[str]
    # JSON-serialisable numbers a reviewer needs: sample sizes, means, CIs, threshold version.
    evidence: dict[str, Any]
    verdict: Verdict
    # True when the caller must send all traffic back to production (canary abort).
    restore_routing: bool = False
    # True when the caller must move the production alias back to the rollback target.
    rollback: bool = False

    def __post_init__(self) -> None:
        if self.gate not in GATE_ORDER:
            raise GateOrderError(f"unknown gate {self.gate!r}; expected one of {GATE_ORDER}")
        if self.passed != (self.verdict is Verdict.PASS):
            raise GateOrderError(
                f"gate {self.gate}: passed={self.passed} contradicts verdict {self.verdict}"
            )

    @property
    def final(self) -> bool:
        """Whether this decision ends the gate (anything but ``continue``)."""
        return self.verdict is not Verdict.CONTINUE

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready form for a ``gate_result`` row or an API response."""
        return {
            "gate": self.gate,
            "passed": self.passed,
            "verdict": self.verdict.value,
            "reasons": list(self.reasons),
            "evidence": self.evidence,
            "restore_routing": self.restore_routing,
            "rollback": self.rollback,
        }


def results_from_decisions(decisions: Iterable[GateDecision]) -> dict[str, bool]:
    """Reduce decisions to ``{gate: passed}``, ignoring ``continue`` (non-final) ones."""
    results: dict[str, bool] = {}
    for decision in decisions:
        if decision.final:
            results[decision.gate] = decision.passed
    return results


def next_gate(results: Mapping[str, bool]) -> str | None:
    """Return the gate to run next, or None once a gate failed or every gate passed."""
    unknown = sorted(set(results) - set(GATE_ORDER))
    if unknown:
        raise GateOrderError(f"unknown gates in results: {unknown}; expected {GATE_ORDER}")
    for index, gate in enumerate(GATE_ORDER):
        if gate not in results:
            later = [g for g in GATE_ORDER[index + 1 :] if g in results]
            if later:
                raise GateOrderError(f"results for {later} exist but {gate!r} has no result")
            return gate
        if not results[gate]:
            later = [g for g in GATE_ORDER[index + 1 :] if g in results]
            if later:
                raise GateOrderError(f"gate {gate!r} failed, yet {later} have results")
            return None
    return None


def failed_gate(results: Mapping[str, bool]) -> str | None:
    """Return the first gate that failed, or None when none has."""
    for gate in GATE_ORDER:
        if gate in results and not results[gate]:
            return gate
    return None
