"""The reward-attribution and behaviour-audit evidence of a gate, as tables a person reads.

Shapes (docs/architecture.md, "Reward attribution" and "Behaviour audit"): offline eval
writes ``attribution`` per eval set and ``behaviour_audit`` at the top level; shadow and
canary write ``attribution`` at the top level (recorded there, not blocking). Gate results
written before these keys existed have none of them: every function here then returns
nothing, so older rows still render.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from web.console.gate_format import num, pct, points, signed

# The term kind that counts as the task; every other kind is shaping or process reward.
TASK_KIND = "task"


@dataclass(frozen=True)
class TermRow:
    """One reward term, candidate against baseline."""

    term: str
    kind: str
    candidate: str
    baseline: str
    delta: str
    # A non-task term whose gain the gate counted against the candidate (shaping_only).
    shortcut: bool = False


@dataclass(frozen=True)
class AttributionView:
    """Where a reward change came from, term by term."""

    title: str
    baseline: str
    terms: list[TermRow]
    facts: list[tuple[str, str]]
    shaping_only: bool
    # "progress (+0.36), valid_action (+0.02)": the shaping terms behind a shaping-only gain.
    shaping_terms: str
    violations: list[str]
    blocking: bool


@dataclass(frozen=True)
class SignalRow:
    """One behaviour signal of the shortcut audit."""

    name: str
    label: str
    candidate: str
    baseline: str
    shift: str
    detail: str
    flagged: bool
    blocking: bool


@dataclass(frozen=True)
class AuditView:
    """The shortcut audit: the candidate's behaviour against the baseline's, on the same tasks."""

    baseline: str
    signals: list[SignalRow] = field(default_factory=list)
    flagged: list[str] = field(default_factory=list)
    blocking_flagged: list[str] = field(default_factory=list)


def _gain(row: Mapping[str, Any]) -> float:
    delta = row.get("delta")
    return float(delta) if isinstance(delta, int | float) else 0.0


def shaping_gains(attribution: Mapping[str, Any]) -> str:
    """The non-task terms that gained, largest first, as the gate's reasons name them."""
    terms = [t for t in attribution.get("terms") or [] if isinstance(t, Mapping)]
    gained = sorted((t for t in terms if t.get("kind") != TASK_KIND and _gain(t) > 0),
                    key=_gain, reverse=True)
    return ", ".join(f"{t.get('term')} ({signed(t.get('delta'))})" for t in gained)


def attribution_view(attribution: Any, title: str, *, blocking: bool) -> AttributionView | None:
    """The per-term table of one attribution block; None when the evidence has none."""
    if not isinstance(attribution, Mapping):
        return None
    shaping_only = bool(attribution.get("shaping_only"))
    terms = []
    for t in attribution.get("terms") or []:
        if not isinstance(t, Mapping):
            continue
        kind = str(t.get("kind") or "—")
        terms.append(TermRow(
            term=str(t.get("term")), kind=kind, candidate=num(t.get("candidate")),
            baseline=num(t.get("baseline")), delta=signed(t.get("delta")),
            shortcut=shaping_only and kind != TASK_KIND and _gain(t) > 0))
    facts = [(label, show(attribution.get(key))) for key, label, show in (
        ("reward_delta", "mean reward change", signed),
        ("task_delta", "of which from the task term", signed),
        ("task_share", "task term's share of the gain", pct),
        ("success_rate_delta", "success rate change", points),
    ) if attribution.get(key) is not None]
    baseline = attribution.get("baseline")
    return AttributionView(
        title=title, baseline=str(baseline) if baseline else "no baseline",
        terms=terms, facts=facts, shaping_only=shaping_only,
        shaping_terms=shaping_gains(attribution) if shaping_only else "",
        violations=[str(v) for v in attribution.get("violations") or []], blocking=blocking)


def attribution_views(gate: str, evidence: Mapping[str, Any]) -> list[AttributionView]:
    """Offline eval: one view per eval set; shadow and canary: one over their episodes."""
    if gate == "offline_eval":
        views = [attribution_view(r.get("attribution"), f"eval set {r.get('eval_set')}",
                                  blocking=True)
                 for r in evidence.get("eval_sets") or [] if isinstance(r, Mapping)]
    else:
        title = {"shadow": "the paired shadow episodes",
                 "canary": "canary against production"}.get(gate, gate)
        views = [attribution_view(evidence.get("attribution"), title, blocking=False)]
    return [v for v in views if v is not None]


def audit_view(evidence: Mapping[str, Any]) -> AuditView | None:
    """The behaviour audit's signals, flagged ones first; None for evidence without one."""
    audit = evidence.get("behaviour_audit")
    if not isinstance(audit, Mapping):
        return None
    flagged = [str(s) for s in audit.get("flagged") or []]
    blocking_flagged = [str(s) for s in audit.get("blocking_flagged") or []]
    rows = []
    for s in audit.get("signals") or []:
        if not isinstance(s, Mapping):
            continue
        name = str(s.get("name"))
        rows.append(SignalRow(
            name=name, label=str(s.get("label") or name), candidate=num(s.get("candidate")),
            baseline=num(s.get("baseline")), shift=signed(s.get("shift")),
            detail=str(s.get("detail") or ""),
            flagged=bool(s.get("flagged")) or name in flagged,
            blocking=bool(s.get("blocking")) or name in blocking_flagged))
    rows.sort(key=lambda r: (not r.flagged, not r.blocking))
    baseline = audit.get("baseline")
    return AuditView(baseline=str(baseline) if baseline else "no baseline", signals=rows,
                     flagged=flagged, blocking_flagged=blocking_flagged)
