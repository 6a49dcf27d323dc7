"""A gate's evidence as an analysis a person can read (pure: evidence in, rows out).

Like Argo Rollouts' analysis runs: each check is one row with the measured value, the
bar it is held to (from the threshold version the gate used) and whether it is met,
unmet or pending (waiting for traffic or information); rows without a bar of their own
are context. The one-line summary above the rows is computed from those rows alone
(``summarise``): it counts what they say, so it cannot claim "all 3 checks met" above an
unmet row or a fourth row. Where the gate wrote its own verdict on a check (offline
eval's per-set ``violations``, the shadow's reasons) the row takes that verdict, rather
than judging the rounded evidence numbers again; a row whose whole interval lies below
its bar is never met.

The shapes read here are the ones the gates write (``governance_loop/gates``);
a key that is missing gives no row rather than an error, so an older gate result
still renders.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeGuard

from triloop.statuses import Gate
from web.console.gate_evidence import (
    AttributionView,
    AuditView,
    attribution_views,
    audit_view,
    shaping_gains,
)
from web.console.gate_format import at_least, estimate, interval, num, pct, points, upper
from web.data.gate_traffic import TrafficProgress

Outcome = Literal["pass", "fail", "inconclusive"]
RowOutcome = Literal["met", "unmet", "pending", "context"]  # context: no bar of its own
NEEDS_TRAFFIC = "needs production traffic"

# The gates that read the section of a threshold spec named after them (offline eval reads
# the top level).
SECTION_GATES = (Gate.SHADOW, Gate.CANARY, Gate.WATCH, Gate.STABILITY)
METRIC_WORDS = {"success_rate": "success rate", "mean_reward": "mean reward"}
HUMAN_GATES = (Gate.AUDIT, Gate.APPROVAL, Gate.PROMOTE)
TRAFFIC_GATES = ("shadow", "canary", "watch")


@dataclass(frozen=True)
class Check:
    """One row of the analysis."""

    name: str
    measured: str
    bar: str
    outcome: RowOutcome
    note: str = ""

    @property
    def label(self) -> str:
        """The row's result in words, as its badge shows it."""
        return ROW_WORDS[self.outcome]


ROW_WORDS: dict[str, str] = {"met": "met", "unmet": "not met", "pending": "pending",
                             "context": "context"}


@dataclass(frozen=True)
class GateAnalysis:
    """The summary in words, the rows it is computed from, and the gate's own thresholds."""

    outcome: Outcome
    verdict: str
    checks: list[Check] = field(default_factory=list)
    thresholds: dict[str, Any] = field(default_factory=dict)
    threshold_version: str | None = None
    waiting_for_traffic: bool = False
    attributions: list[AttributionView] = field(default_factory=list)
    audit: AuditView | None = None

    @property
    def judged(self) -> list[Check]:
        """The rows with a bar (the checks table); context rows are shown beside it."""
        return [c for c in self.checks if c.outcome != "context"]

    @property
    def context(self) -> list[Check]:
        """Rows measured alongside the checks, with no bar of their own."""
        return [c for c in self.checks if c.outcome == "context"]


def relevant_thresholds(gate: str, spec: Mapping[str, Any] | None,
                        evidence: Mapping[str, Any]) -> dict[str, Any]:
    """The thresholds this gate is held to: its section of the threshold version, over the
    copy the gate wrote into its evidence (which also holds the defaults a version leaves
    out, so every bar the gate applied has its row)."""
    copied = evidence.get("thresholds")
    bars = {k: v for k, v in copied.items() if not isinstance(v, Mapping)} \
        if isinstance(copied, Mapping) else {}
    if spec:
        if gate in SECTION_GATES and isinstance(spec.get(gate), Mapping):
            bars.update(spec[gate])
        if gate == Gate.OFFLINE_EVAL:
            bars.update({k: v for k, v in spec.items() if not isinstance(v, Mapping)
                         and k != "version"})
    return bars


def _section(spec: Mapping[str, Any] | None, evidence: Mapping[str, Any],
             name: str) -> dict[str, Any]:
    """A nested offline-eval section (``attribution``) of the version, else of the evidence."""
    for source in ((spec or {}), evidence.get("thresholds") or {}):
        found = source.get(name) if isinstance(source, Mapping) else None
        if isinstance(found, Mapping):
            return dict(found)
    return {}


def _number(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _judged(violations: list[str] | None, key: str, *, numbers_say_met: bool,
            whole_interval_below: bool = False, label: str | None = None) -> RowOutcome:
    """Met or unmet: the gate's own violations when it wrote them (each names its threshold
    key), else the numbers; an interval wholly below its bar is unmet either way."""
    if whole_interval_below:
        return "unmet"
    if violations is not None:
        named = [v for v in violations if key in v and (label is None or label in v)]
        return "unmet" if named else "met"
    return "met" if numbers_say_met else "unmet"


def _offline_set_checks(result: Mapping[str, Any], bars: Mapping[str, Any],
                        attribution_bars: Mapping[str, Any]) -> list[Check]:
    checks: list[Check] = []
    name = str(result.get("eval_set", "eval set"))
    raw = result.get("violations")
    violations = [str(v) for v in raw] if isinstance(raw, list) else None
    min_samples = bars.get("min_samples")
    for arm in ("candidate", "production"):
        stats = result.get(arm)
        if isinstance(stats, Mapping) and isinstance(min_samples, int):
            episodes = int(stats.get("episodes") or 0)
            checks.append(Check(f"{name}: {arm} episodes", str(episodes), f"≥ {min_samples}",
                                _judged(violations, "min_samples", label=f"{arm} has",
                                        numbers_say_met=episodes >= min_samples)))
    candidate = result.get("candidate")
    measured = candidate.get("success_rate") if isinstance(candidate, Mapping) else None
    rate, min_rate = estimate(measured), bars.get("min_success_rate")
    if rate is not None and _number(min_rate):
        high = upper(measured)
        checks.append(Check(
            f"{name}: candidate success rate", interval(measured, pct), at_least(min_rate, pct),
            _judged(violations, "min_success_rate", numbers_say_met=rate >= min_rate,
                    whole_interval_below=high is not None and high < min_rate)))
    for key, words, show, bar_key in (
            ("success_rate_delta", "success rate vs production", points,
             "max_regression_vs_production"),
            ("reward_delta", "mean reward vs production", num,
             "max_reward_regression_vs_production")):
        delta, most = estimate(result.get(key)), bars.get(bar_key)
        if delta is None or not _number(most):
            continue
        high = upper(result[key])
        checks.append(Check(
            f"{name}: {words}", interval(result[key], show), at_least(-most, show),
            _judged(violations, bar_key, numbers_say_met=delta >= -most,
                    whole_interval_below=high is not None and high < -most)))
    return checks + _attribution_checks(name, result.get("attribution"), attribution_bars)


def _attribution_checks(name: str, attribution: Any, bars: Mapping[str, Any]) -> list[Check]:
    """Rows for the attribution bars (DESIGN §2) the threshold sets; none without evidence."""
    if not isinstance(attribution, Mapping):
        return []
    violations = [str(v) for v in attribution.get("violations") or []]
    checks: list[Check] = []
    reward_delta = attribution.get("reward_delta")
    share, min_share = attribution.get("task_share"), bars.get("min_task_share")
    if _number(min_share):
        gained = _number(reward_delta) and reward_delta > 0
        shortcut = shaping_gains(attribution) if attribution.get("shaping_only") else ""
        checks.append(Check(
            f"{name}: share of the reward gain from the task term",
            pct(share) if gained else "no reward gain", at_least(min_share, pct),
            _judged(violations, "min_task_share",
                    numbers_say_met=not gained or (_number(share) and share >= min_share)),
            f"the gain is from shaping terms: {shortcut}" if shortcut else
            "" if gained else "nothing to attribute: the mean reward did not rise"))
    for key, words, measured, show in (
            ("min_reward_gain", "mean reward gain over the baseline", reward_delta, num),
            ("min_success_gain", "success rate gain over the baseline",
             attribution.get("success_rate_delta"), points)):
        bar = bars.get(key)
        if _number(bar):
            checks.append(Check(f"{name}: {words}", show(measured), at_least(bar, show),
                                _judged(violations, key, numbers_say_met=_number(measured)
                                        and measured >= bar)))
    named = {"min_task_share", "min_reward_gain", "min_success_gain"}
    for other in violations:  # a rule this page has no row for still shows as unmet
        if not any(key in other for key in named if _number(bars.get(key))):
            checks.append(Check(f"{name}: reward attribution", "rule not met", "—", "unmet",
                                other))
    return checks


def _audit_checks(evidence: Mapping[str, Any]) -> list[Check]:
    """One row per blocking signal of the behaviour audit (DESIGN §3): unmet when flagged."""
    audit = audit_view(evidence)
    if audit is None:
        return []
    return [Check(f"Shortcut audit: {s.label}", f"{s.candidate} vs baseline {s.baseline}",
                  "no flag", "unmet" if s.flagged else "met", s.detail)
            for s in audit.signals if s.blocking]


def _offline_checks(evidence: Mapping[str, Any], bars: Mapping[str, Any],
                    spec: Mapping[str, Any] | None) -> list[Check]:
    attribution_bars = _section(spec, evidence, "attribution")
    checks: list[Check] = []
    for result in evidence.get("eval_sets") or []:
        if isinstance(result, Mapping):
            checks += _offline_set_checks(result, bars, attribution_bars)
    return checks + _audit_checks(evidence)


def _shadow_checks(evidence: Mapping[str, Any], bars: Mapping[str, Any],
                   reasons: list[str]) -> list[Check]:
    """The shadow rule (gates.shadow) row by row. Agreement below its floor is not a miss on
    its own: the rule also accepts a reward delta that is not significantly negative, so
    that is one row with both halves, met when either holds."""
    checks: list[Check] = []
    n, min_samples = evidence.get("paired_episodes"), bars.get("min_samples")
    enough = isinstance(n, int) and isinstance(min_samples, int) and n >= min_samples
    if isinstance(n, int) and isinstance(min_samples, int):
        checks.append(Check("Paired production episodes", str(n), f"≥ {min_samples}",
                            "met" if enough else "pending", "" if enough else NEEDS_TRAFFIC))
    delta = evidence.get("reward_delta")
    floor = bars.get("agreement_floor")
    if _number(floor):
        compared, agreed = evidence.get("steps_compared"), evidence.get("steps_agreed")
        rate = (agreed / compared if isinstance(compared, int) and compared
                and isinstance(agreed, int) else evidence.get("agreement_rate"))
        high = upper(delta)
        worse = evidence.get("reward_delta_significantly_negative")
        worse = bool(worse) if isinstance(worse, bool) else high is not None and high < 0
        agrees = _number(rate) and rate >= floor
        measured = (f"agreement {pct(rate) if _number(rate) else '— (no steps compared)'}; "
                    f"reward delta upper bound {num(high)}")
        outcome: RowOutcome
        if not enough:
            outcome, note = "pending", "judged once the minimum sample is reached"
        elif agrees:
            outcome, note = "met", "agreement is at or above its floor"
        elif not worse:
            outcome, note = "met", ("agreement is below its floor, which the rule accepts "
                                    "because the reward delta is not significantly negative")
        else:
            outcome, note = "unmet", ("agreement is below its floor and the reward delta is "
                                      "significantly negative")
        checks.append(Check("Action agreement with production, or a reward not significantly "
                            "worse", measured, f"agreement ≥ {pct(floor)}, or upper bound ≥ 0",
                            outcome, note))
    mean, most = estimate(delta), bars.get("max_mean_reward_regression")
    if mean is not None and _number(most):
        checks.append(Check(
            "Mean reward, candidate − production", interval(delta), at_least(-most),
            "pending" if not n else _judged(reasons, "max_mean_reward_regression",
                                            numbers_say_met=mean >= -most)))
    return checks


def _sequential_rows(metrics: Any, prefix: str, *, abort_words: str,
                     with_not_worse: bool) -> list[Check]:
    """Rows of the always-valid tests (canary, watch): evidence against the boundaries."""
    checks: list[Check] = []
    for metric in metrics or []:
        if not isinstance(metric, Mapping):
            continue
        words = METRIC_WORDS.get(str(metric.get("metric")), str(metric.get("metric")))
        if metric.get("degenerate"):
            checks.append(Check(f"{prefix}{words}", "not enough information", "—",
                                "pending", "the arms' outcomes do not vary yet"))
            continue
        regressed = metric.get("log_evidence_regressed")
        boundary = metric.get("regressed_boundary")
        if _number(regressed) and _number(boundary):
            checks.append(Check(
                f"{prefix}{words}: evidence of a regression", num(regressed),
                f"{abort_words} at ≥ {num(boundary)}",
                "unmet" if regressed >= boundary else "met",
                "log e-value; higher means more evidence it is worse"))
        not_worse = metric.get("log_evidence_not_worse")
        pass_at = metric.get("not_worse_boundary")
        if with_not_worse and _number(not_worse) and _number(pass_at):
            effect = metric.get("effect_to_detect")
            # The success-rate effect is absolute (a drop in points), not relative.
            by = (f" by {points(effect).removeprefix('+')}" if words == "success rate"
                  else f" by {num(effect)}")
            checks.append(Check(
                f"{prefix}{words}: evidence it is not worse{by if effect else ''}",
                num(not_worse), f"pass at ≥ {num(pass_at)}",
                "met" if not_worse >= pass_at else "pending",
                f"{pct(metric.get('information_fraction'))} of the planned information"))
    return checks


def _arms_row(name: str, arms: Mapping[str, Any], bar: Any) -> Check | None:
    counts = {label: int(arm.get("episodes") or 0) for label, arm in arms.items()
              if isinstance(arm, Mapping)}
    if not counts or not isinstance(bar, int):
        return None
    measured = " · ".join(f"{label} {n}" for label, n in counts.items())
    enough = min(counts.values()) >= bar
    return Check(name, measured, f"≥ {bar} each", "met" if enough else "pending",
                 "" if enough else NEEDS_TRAFFIC)


def _rate_row(name: str, arms: tuple[Any, Any], delta: Any) -> Check | None:
    first, second = arms
    if not isinstance(first, Mapping) or not isinstance(second, Mapping):
        return None
    measured = (f"{pct(first.get('success_rate'))} vs {pct(second.get('success_rate'))}"
                f" ({interval(delta, points)})")
    return Check(name, measured, "—", "context", "judged by the tests below")


def _canary_checks(evidence: Mapping[str, Any], bars: Mapping[str, Any]) -> list[Check]:
    arms = {"canary": evidence.get("canary"), "production": evidence.get("production")}
    rows = [_arms_row("Episodes per arm", arms, bars.get("min_samples_per_arm")),
            _rate_row("Success rate, canary vs production",
                      (evidence.get("canary"), evidence.get("production")),
                      evidence.get("success_rate_delta"))]
    checks = [r for r in rows if r is not None]
    tests = _sequential_rows(evidence.get("metrics"), "", abort_words="abort",
                             with_not_worse=True)
    if checks and checks[0].outcome == "pending":
        # The canary aborts only once both arms have the minimum sample (gates.canary).
        tests = [replace(c, outcome="pending", note=c.note + "; too few episodes to "
                         "act on") if c.outcome == "unmet" else c for c in tests]
    return checks + tests


def _watch_checks(evidence: Mapping[str, Any], bars: Mapping[str, Any]) -> list[Check]:
    checks: list[Check] = []
    baselines = evidence.get("baselines")
    single = {"production": evidence} if "baseline" in evidence else {}
    for name, found in (baselines.items() if isinstance(baselines, Mapping) else
                        single.items()):
        if not isinstance(found, Mapping):
            continue
        prefix = f"vs {name}: "
        arms = {"promoted": found.get("promoted"), "baseline": found.get("baseline")}
        row = _arms_row(f"{prefix}episodes", arms, bars.get("min_samples"))
        checks += [row] if row is not None else []
        checks += _sequential_rows(found.get("metrics"), prefix, abort_words="roll back",
                                   with_not_worse=False)
    return checks


def _stability_checks(evidence: Mapping[str, Any], bars: Mapping[str, Any]) -> list[Check]:
    blocking = evidence.get("blocking_alarms")
    window = bars.get("alarm_window_iterations")
    if not isinstance(blocking, list):
        return []
    within = f" in the last {window} iterations" if window is not None else ""
    kinds = ", ".join(sorted({str(a.get("kind", a)) if isinstance(a, Mapping) else str(a)
                              for a in blocking})).replace("_", " ")
    return [Check(f"Stability alarms{within} before the proposal",
                  str(len(blocking)) + (f" ({kinds})" if kinds else ""), "0",
                  "met" if not blocking else "unmet",
                  "an operator who did not submit the run may override them")]


def _rows_of(gate: str, evidence: Mapping[str, Any], bars: Mapping[str, Any],
             spec: Mapping[str, Any] | None, reasons: list[str]) -> list[Check]:
    """The rows of one gate's evidence; a gate without a table (the human ones) has none."""
    if gate == Gate.OFFLINE_EVAL:
        return _offline_checks(evidence, bars, spec)
    if gate == Gate.SHADOW:
        return _shadow_checks(evidence, bars, reasons)
    if gate == Gate.CANARY:
        return _canary_checks(evidence, bars)
    if gate == Gate.WATCH:
        return _watch_checks(evidence, bars)
    if gate == Gate.STABILITY:
        return _stability_checks(evidence, bars)
    return []


def _clipped(text: str, most: int = 100) -> str:
    return text if len(text) <= most else text[:most].rstrip() + "…"


def _row_words(check: Check, with_bar: bool) -> str:
    if check.bar == "—":  # a rule without a bar of its own: its words say what failed
        return f"{check.name} ({_clipped(check.note)})" if check.note else check.name
    return f"{check.name} {check.measured}" + (f" (needs {check.bar})" if with_bar else "")


def _listed(rows: list[Check], *, with_bar: bool = True) -> str:
    shown = "; ".join(_row_words(c, with_bar) for c in rows[:2])
    return shown + (f" and {len(rows) - 2} more" if len(rows) > 2 else "")


def _checks(count: int) -> str:
    return "1 check" if count == 1 else f"{count} checks"


def summarise(gate: str, passed: bool, checks: list[Check], reasons: list[str]) -> str:
    """The sentence above the rows, computed from them: the counts it states are the rows'
    counts, and it never calls a check met that a row shows unmet or pending."""
    words = gate.replace("_", " ").capitalize()
    judged = [c for c in checks if c.outcome != "context"]
    unmet = [c for c in judged if c.outcome == "unmet"]
    pending = [c for c in judged if c.outcome == "pending"]
    if not judged:
        said = f": {reasons[0]}" if reasons else "."
        return f"{words} {'passed' if passed else 'failed'}{said}"
    if passed and not unmet and not pending:
        return (f"{words} passed: the 1 check met its bar." if len(judged) == 1 else
                f"{words} passed: all {len(judged)} checks met their bars.")
    if passed:  # governance's rule passed what a row shows short: say both, claim neither
        return (f"{words} passed by governance's rule, but {len(unmet) + len(pending)} of "
                f"{_checks(len(judged))} here did not meet their bars: "
                f"{_listed(unmet + pending)}. Governance's reasons are below.")
    if unmet:
        return (f"{words} failed: {len(unmet)} of {_checks(len(judged))} did not meet "
                f"{'its bar' if len(unmet) == 1 else 'their bars'}: {_listed(unmet)}.")
    traffic = [c for c in pending if c.note == NEEDS_TRAFFIC]
    if traffic:
        c = traffic[0]
        return (f"{words} did not see enough production traffic: {c.measured}, needs "
                f"{c.bar.removeprefix('≥ ')}. Shadow and canary judge real production "
                "episodes: send them (POST /api/episodes) and propose the candidate again.")
    return (f"{words} failed undecided: {len(pending)} of {_checks(len(judged))} stayed "
            f"pending: {_listed(pending, with_bar=False)}.")


def _unexplained(passed: bool, checks: list[Check], reasons: list[str]) -> list[Check]:
    """A failed gate whose rows all look met failed on a rule this page has no row for
    (a newer check): its reasons become unmet rows, so the rows still explain the verdict."""
    if passed or not reasons or any(c.outcome in ("unmet", "pending") for c in checks):
        return []
    if not any(c.outcome != "context" for c in checks):
        return []  # no rows at all: the summary quotes the reason itself
    return [Check("Governance's reason", "not met", "—", "unmet", reason) for reason in reasons]


def analyse_gate(
    *, gate: str, passed: bool, reasons: list[str], evidence: Mapping[str, Any],
    threshold_spec: Mapping[str, Any] | None,
) -> GateAnalysis:
    """The analysis of one recorded gate result: rows first, the summary from the rows."""
    bars = relevant_thresholds(gate, threshold_spec, evidence)
    checks = _rows_of(gate, evidence, bars, threshold_spec, reasons)
    checks += _unexplained(passed, checks, reasons)
    version = evidence.get("threshold_version") or (threshold_spec or {}).get("version")
    unmet = any(c.outcome == "unmet" for c in checks)
    traffic = any(c.note == NEEDS_TRAFFIC and c.outcome == "pending" for c in checks)
    outcome: Outcome = "pass" if passed else (
        "inconclusive" if not unmet and any(c.outcome == "pending" for c in checks)
        else "fail")
    return GateAnalysis(outcome=outcome, verdict=summarise(gate, passed, checks, reasons),
                        checks=checks, thresholds={} if gate in HUMAN_GATES else bars,
                        threshold_version=None if version is None else str(version),
                        waiting_for_traffic=traffic and not unmet and not passed,
                        attributions=attribution_views(gate, evidence),
                        audit=audit_view(evidence) if gate == Gate.OFFLINE_EVAL else None)


@dataclass(frozen=True)
class OpenGateNotice:
    """What an open shadow, canary or watch gate waits for: one notice, from one count."""

    # "Waiting for production traffic: 3 of 12 paired episodes." or "... is enough ...";
    # None where nothing counts traffic for the page (watch).
    headline: str | None
    # How production episodes arrive; None once the count has reached its bar.
    explanation: str | None
    enough: bool


def _waiting_explanation(gate: str, threshold_spec: Mapping[str, Any] | None) -> str:
    bars = relevant_thresholds(gate, threshold_spec, {})
    need = bars.get("min_samples_per_arm" if gate == "canary" else "min_samples")
    what = {"shadow": "paired episodes (production beside the candidate's shadow)",
            "canary": "episodes in each arm (canary and production)",
            "watch": "episodes of the promoted model"}[gate]
    amount = f"at least {need} {what}" if need is not None else what
    return (f"Waiting for production traffic: the {gate} gate judges real production "
            f"episodes and needs {amount}. Production episodes come from POST /api/episodes "
            "(or the demo's traffic generator); without them the gate fails at the end of "
            "its soak.")


def open_gate_notice(gate: str, threshold_spec: Mapping[str, Any] | None,
                     traffic: TrafficProgress | None) -> OpenGateNotice | None:
    """The notice of an open traffic-fed gate. The count decides it: once the traffic is
    enough, nothing on the page still says the gate waits for traffic."""
    if gate not in TRAFFIC_GATES:
        return None
    counted = traffic if traffic is not None and traffic.gate == gate else None
    if counted is not None and counted.enough:
        return OpenGateNotice(headline=f"{counted.message[:1].upper()}{counted.message[1:]}.",
                              explanation=None, enough=True)
    headline = (f"{counted.message[:1].upper()}{counted.message[1:]}."
                if counted is not None else None)
    return OpenGateNotice(headline=headline,
                          explanation=_waiting_explanation(gate, threshold_spec), enough=False)


def waiting_gate_note(gate: str, threshold_spec: Mapping[str, Any] | None) -> str | None:
    """What an open promotion at a traffic-fed gate is waiting for, when nothing counts it."""
    notice = open_gate_notice(gate, threshold_spec, None)
    return None if notice is None else notice.explanation
