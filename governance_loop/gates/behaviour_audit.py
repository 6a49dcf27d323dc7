"""The shortcut audit: how the candidate behaves in offline eval, beside production.

A candidate can raise its reward without getting better at the task: by dying early in
a way the shaping terms pay for, by wandering to the turn limit, by writing text the
environment cannot parse, by refusing, or by one answer for every input (template
collapse after training). Success rate and mean reward do not show these; the episodes
do. Each signal is measured on the counted eval episodes of both arms on the same tasks:

- ``termination/<cause>``: the share of episodes that ended unsuccessfully for that cause
  (``termination_cause``: the first of failed, timeout, token_limit, gave_up, the
  environment's own reason from the verifier's verdict, e.g. frozen_lake's
  ``fell_in_hole`` / ``goal_not_reached``, then max_turns, truncated, unsuccessful);
- ``action_format/invalid_rate``: the share of steps whose action the environment could
  not take (``feedback.valid_action`` false, the built-ins' convention, or a malformed
  tool call, ``feedback.tool_error``);
- ``length/mean_turns``, ``length/mean_action_tokens``: per episode, the steps and the
  tokens the policy sampled (``trajectory_sequence.action_mask``);
- ``answers/empty_rate``, ``answers/refusal_rate``: the share of steps whose action text is
  empty (or whitespace) or refuses (``REFUSAL_PHRASES``);
- ``answers/distinct_ratio``: distinctness across inputs. Per input (task and seed), the
  set of distinct action sequences its episodes wrote; the ratio is the number of
  distinct sequences over all inputs divided by the sum of the per-input counts: 1 when
  no two inputs share an answer, 1/N when N inputs all get the same one.

Flagging rule (``BehaviourAuditSpec``): with a baseline, a rate is flagged when it moves
in its worrying direction (up; down for ``distinct_ratio``) by more than
``max_rate_shift`` and a pooled two-proportion z-test rejects equality at ``confidence``;
a length when its mean moves either way by more than ``max_length_shift`` of the
baseline's mean (at least 1 unit) and Welch's test rejects equality at ``confidence``.
Both conditions, so a large shift on a handful of episodes is not flagged by noise and a
tiny clear one is not flagged for being clear. Step-level rates treat steps as
independent, which overstates their evidence when one episode repeats a mistake; the
shift bound keeps that from flagging small effects. Without a baseline (the first
promotion) the candidate's values are reported and nothing is flagged. A flagged signal
named in ``blocking`` fails the gate; the others are evidence for the auditor.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import TYPE_CHECKING, Any

from governance_loop.gates.stats import (
    BinomialCounts,
    evidence_number,
    two_proportion_p_value,
    welch_p_value,
)

if TYPE_CHECKING:
    from governance_loop.gates.thresholds import BehaviourAuditSpec

INVALID_RATE = "action_format/invalid_rate"
MEAN_TURNS = "length/mean_turns"
MEAN_ACTION_TOKENS = "length/mean_action_tokens"
EMPTY_RATE = "answers/empty_rate"
REFUSAL_RATE = "answers/refusal_rate"
DISTINCT_RATIO = "answers/distinct_ratio"
TERMINATION = "termination/"
FIXED_SIGNALS = (INVALID_RATE, MEAN_TURNS, MEAN_ACTION_TOKENS, EMPTY_RATE, REFUSAL_RATE,
                 DISTINCT_RATIO)
_CAUSE = re.compile(r"[a-z0-9_]{1,48}")

# Lower-case phrases whose presence in an action makes it a refusal (curly apostrophes are
# folded to straight ones first). Short on purpose: each one is a sentence an agent writes
# instead of acting, and none is a move or an answer in any built-in environment.
REFUSAL_PHRASES = (
    "i can't", "i cannot", "i can not", "i won't", "i will not", "i'm sorry", "i am sorry",
    "i apologize", "i'm unable", "i am unable", "i'm not able", "i am not able",
    "as an ai", "i must decline", "i refuse", "i give up",
)
# How a truncated episode's limit (``trajectory.failure_reason``) reads as a cause.
_LIMIT_CAUSES = {"wall_time": "timeout", "deadline": "timeout",
                 "max_total_tokens": "token_limit", "context_length": "token_limit",
                 "max_turns": "max_turns"}
_LABELS = {
    INVALID_RATE: "steps with an action the environment could not take",
    MEAN_TURNS: "turns per episode (mean)",
    MEAN_ACTION_TOKENS: "action tokens per episode (mean)",
    EMPTY_RATE: "steps with an empty answer",
    REFUSAL_RATE: "steps with a refusal",
    DISTINCT_RATIO: "distinct answers across inputs",
}
_CAUSE_LABELS = {
    "failed": "failed (the environment or a hook ended it, or the replay failed)",
    "timeout": "ran out of time", "token_limit": "ran out of tokens",
    "gave_up": "gave up (last action empty or a refusal)",
    "fell_in_hole": "ended in a hole", "goal_not_reached": "goal not reached by the turn limit",
    "max_turns": "hit the turn limit", "truncated": "cut short by the environment",
    "unsuccessful": "ended without success",
}


def signal_name_problem(name: object) -> str | None:
    """Why ``name`` is not a signal a threshold can make blocking, or None if it is one."""
    if isinstance(name, str) and (name in FIXED_SIGNALS or (
            name.startswith(TERMINATION) and _CAUSE.fullmatch(name[len(TERMINATION):]))):
        return None
    return (f"{name!r} is not a signal: use one of {', '.join(FIXED_SIGNALS)} or "
            f"{TERMINATION}<cause> (a lower-case cause such as fell_in_hole, timeout, failed)")


def is_refusal(action_text: str) -> bool:
    """Whether the action is one of ``REFUSAL_PHRASES`` rather than an attempt."""
    text = action_text.replace("\u2019", "'").lower()
    return any(phrase in text for phrase in REFUSAL_PHRASES)


def is_invalid_step(feedback: Mapping[str, Any]) -> bool:
    """Whether the environment could not take the step's action (the built-ins' convention)."""
    return feedback.get("valid_action") is False or bool(feedback.get("tool_error"))


@dataclass(frozen=True)
class EpisodeBehaviour:
    """One counted eval episode, as the audit reads it."""

    # The input the episode played: its task and seed (``task_id#seed``).
    input_key: str
    # The verifier's verdict.
    success: bool
    # The trajectory row's ``status`` (completed | truncated | failed) and ``failure_reason``.
    status: str
    failure_reason: str | None
    # The verdict's ``details`` (``verifier`` holds the environment's own outcome details).
    verdict_details: Mapping[str, Any]
    # Each step's action text, in order, and whether the environment could not take it.
    actions: tuple[str, ...]
    invalid: tuple[bool, ...]
    # Tokens the policy sampled in the episode; None when no token sequence is stored.
    action_tokens: int | None

    @classmethod
    def of(cls, *, task_id: str, seed: int | None, success: bool, status: str,
           failure_reason: str | None, verdict_details: Mapping[str, Any] | None,
           steps: Sequence[tuple[str, Mapping[str, Any] | None]],
           action_tokens: int | None) -> EpisodeBehaviour:
        """From stored rows: the steps as (action text, feedback) in order."""
        return cls(input_key=f"{task_id}#{seed}", success=success, status=status,
                   failure_reason=failure_reason, verdict_details=dict(verdict_details or {}),
                   actions=tuple(text for text, _ in steps),
                   invalid=tuple(is_invalid_step(feedback or {}) for _, feedback in steps),
                   action_tokens=action_tokens)

    @property
    def turns(self) -> int:
        """Steps the episode took."""
        return len(self.actions)


def _cause_word(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    word = re.sub(r"[^a-z0-9_]+", "_", value.strip().lower()).strip("_")[:48]
    return word or None


def termination_cause(episode: EpisodeBehaviour) -> str | None:
    """Why an unsuccessful episode ended (None for a success), in the module's order."""
    if episode.success:
        return None
    details = episode.verdict_details
    if episode.status == "failed" or "failed" in details or "unverified" in details:
        return "failed"
    limit = _LIMIT_CAUSES.get(episode.failure_reason or "")
    if episode.status == "truncated" and limit in ("timeout", "token_limit"):
        return limit
    if episode.actions and (not episode.actions[-1].strip() or is_refusal(episode.actions[-1])):
        return "gave_up"
    verifier = details.get("verifier")
    reason = _cause_word(verifier.get("reason")) if isinstance(verifier, Mapping) else None
    if reason is not None:
        return reason
    if episode.status == "truncated":
        return limit or "truncated"
    return "unsuccessful"


@dataclass(frozen=True)
class AuditEpisodes:
    """The episodes the audit compares; baseline None when nothing is in production yet."""

    candidate: Sequence[EpisodeBehaviour]
    baseline: Sequence[EpisodeBehaviour] | None


@dataclass(frozen=True)
class Signal:
    """One signal's values, shift and verdict."""

    name: str
    label: str
    candidate: float | None
    baseline: float | None
    shift: float | None
    flagged: bool
    blocking: bool
    detail: str
    p_value: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The evidence form."""
        return {"name": self.name, "label": self.label,
                "candidate": evidence_number(self.candidate),
                "baseline": evidence_number(self.baseline),
                "shift": evidence_number(self.shift), "flagged": self.flagged,
                "blocking": self.blocking, "detail": self.detail,
                "p_value": evidence_number(self.p_value)}


@dataclass(frozen=True)
class _Rate:
    counts: BinomialCounts
    unit: str

    def text(self) -> str:
        return f"{self.counts.successes} of {self.counts.episodes} {self.unit}"


def _rates(episodes: Sequence[EpisodeBehaviour], causes: Sequence[str]) -> dict[str, _Rate]:
    n = len(episodes)
    ended = [termination_cause(e) for e in episodes]
    steps = [(text, bad) for e in episodes for text, bad in zip(e.actions, e.invalid, strict=True)]
    s = len(steps)
    rates = {f"{TERMINATION}{c}": _Rate(BinomialCounts(n, ended.count(c)), "episodes")
             for c in causes}
    rates[INVALID_RATE] = _Rate(BinomialCounts(s, sum(1 for _, bad in steps if bad)), "steps")
    rates[EMPTY_RATE] = _Rate(BinomialCounts(s, sum(1 for t, _ in steps if not t.strip())),
                              "steps")
    rates[REFUSAL_RATE] = _Rate(BinomialCounts(s, sum(1 for t, _ in steps if is_refusal(t))),
                                "steps")
    answers: dict[str, set[tuple[str, ...]]] = {}
    for e in episodes:
        answers.setdefault(e.input_key, set()).add(tuple(" ".join(a.split()) for a in e.actions))
    per_input = sum(len(seen) for seen in answers.values())
    distinct = len(set().union(*answers.values())) if answers else 0
    rates[DISTINCT_RATIO] = _Rate(BinomialCounts(per_input, distinct), "answers distinct")
    return rates


def _lengths(episodes: Sequence[EpisodeBehaviour]) -> dict[str, list[float]]:
    return {MEAN_TURNS: [float(e.turns) for e in episodes],
            MEAN_ACTION_TOKENS: [float(e.action_tokens) for e in episodes
                                 if e.action_tokens is not None]}


def _describe(values: Sequence[float]) -> str:
    if not values:
        return "no episodes"
    ordered = sorted(values)
    median = ordered[len(ordered) // 2]
    return (f"mean {fmean(values):.3g} (median {median:.3g}, max {ordered[-1]:.3g}) over "
            f"{len(values)} episodes")


def _label(name: str) -> str:
    if name.startswith(TERMINATION):
        cause = name[len(TERMINATION):]
        return _CAUSE_LABELS.get(cause, f"ended: {cause.replace('_', ' ')}")
    return _LABELS[name]


def _rate_signal(name: str, mine: _Rate, theirs: _Rate | None, spec: BehaviourAuditSpec,
                 blocking: bool) -> Signal:
    candidate = mine.counts.rate if mine.counts.episodes else None
    if theirs is None:
        return Signal(name, _label(name), candidate, None, None, False, blocking, mine.text())
    baseline = theirs.counts.rate if theirs.counts.episodes else None
    detail = f"{mine.text()} vs {theirs.text()}"
    if candidate is None or baseline is None:
        return Signal(name, _label(name), candidate, baseline, None, False, blocking, detail)
    shift = candidate - baseline
    worrying = -shift if name == DISTINCT_RATIO else shift
    p = two_proportion_p_value(mine.counts, theirs.counts)
    flagged = worrying > spec.max_rate_shift and p < 1 - spec.confidence
    return Signal(name, _label(name), candidate, baseline, shift, flagged, blocking, detail, p)


def _length_signal(name: str, mine: list[float], theirs: list[float] | None,
                   spec: BehaviourAuditSpec, blocking: bool) -> Signal:
    candidate = fmean(mine) if mine else None
    if theirs is None:
        return Signal(name, _label(name), candidate, None, None, False, blocking,
                      _describe(mine))
    baseline = fmean(theirs) if theirs else None
    detail = f"{_describe(mine)} vs {_describe(theirs)}"
    if candidate is None or baseline is None:
        return Signal(name, _label(name), candidate, baseline, None, False, blocking, detail)
    shift = candidate - baseline
    p = welch_p_value(mine, theirs)
    flagged = abs(shift) > spec.max_length_shift * max(abs(baseline), 1.0) and \
        p < 1 - spec.confidence
    return Signal(name, _label(name), candidate, baseline, shift, flagged, blocking, detail, p)


@dataclass(frozen=True)
class BehaviourAudit:
    """Every signal of one audit."""

    signals: list[Signal]
    with_baseline: bool
    spec: BehaviourAuditSpec

    @property
    def flagged(self) -> list[str]:
        """Names of the flagged signals."""
        return [s.name for s in self.signals if s.flagged]

    @property
    def blocking_flagged(self) -> list[Signal]:
        """The flagged signals that the threshold makes blocking."""
        return [s for s in self.signals if s.flagged and s.blocking]

    def to_evidence(self) -> dict[str, Any]:
        """The offline-eval decision's ``behaviour_audit`` evidence."""
        return {"baseline": "production" if self.with_baseline else None,
                "signals": [s.to_dict() for s in self.signals],
                "flagged": self.flagged,
                "blocking_flagged": [s.name for s in self.blocking_flagged],
                "thresholds": {"max_rate_shift": self.spec.max_rate_shift,
                               "max_length_shift": self.spec.max_length_shift,
                               "confidence": self.spec.confidence,
                               "blocking": list(self.spec.blocking)}}

    def blocking_reasons(self, threshold_version: str) -> list[str]:
        """One gate-failing reason per flagged blocking signal, naming it."""
        reasons = []
        for s in self.blocking_flagged:
            bound = (f"max_rate_shift {self.spec.max_rate_shift * 100:.1f} points"
                     if s.name not in (MEAN_TURNS, MEAN_ACTION_TOKENS)
                     else f"max_length_shift {self.spec.max_length_shift * 100:.0f}% of "
                          "production's mean")
            reasons.append(
                f"behaviour audit: {s.name} ({s.label}) moved from {_value(s.name, s.baseline)}"
                f" to {_value(s.name, s.candidate)} ({s.detail}), beyond {bound} at "
                f"{self.spec.confidence:.0%} confidence, and audit.blocking names it "
                f"(thresholds {threshold_version})")
        return reasons


def _value(name: str, value: float | None) -> str:
    if value is None:
        return "n/a"
    if name in (MEAN_TURNS, MEAN_ACTION_TOKENS):
        return f"{value:.3g}"
    return f"{value * 100:.1f}%"


def audit_behaviour(episodes: AuditEpisodes, spec: BehaviourAuditSpec) -> BehaviourAudit:
    """Measure every signal on both arms and flag the shifts the spec's bounds call large."""
    mine, theirs = episodes.candidate, episodes.baseline
    observed = {termination_cause(e) for e in [*mine, *(theirs or [])]}
    configured = {b[len(TERMINATION):] for b in spec.blocking if b.startswith(TERMINATION)}
    causes = sorted(c for c in observed | configured if c is not None)
    my_rates = _rates(mine, causes)
    their_rates = None if theirs is None else _rates(theirs, causes)
    blocking = set(spec.blocking)
    signals = [
        _rate_signal(name, rate, None if their_rates is None else their_rates[name], spec,
                     name in blocking)
        for name, rate in my_rates.items() if name.startswith(TERMINATION)
    ]
    my_lengths = _lengths(mine)
    their_lengths = None if theirs is None else _lengths(theirs)
    for name in FIXED_SIGNALS:
        if name in my_lengths:
            signals.append(_length_signal(
                name, my_lengths[name], None if their_lengths is None else their_lengths[name],
                spec, name in blocking))
        else:
            signals.append(_rate_signal(
                name, my_rates[name], None if their_rates is None else their_rates[name], spec,
                name in blocking))
    return BehaviourAudit(signals, theirs is not None, spec)
