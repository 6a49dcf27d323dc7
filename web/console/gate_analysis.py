"""A gate's evidence as an analysis a person can read (pure: evidence in, rows out).

Like Argo Rollouts' analysis runs: each check is one row with the measured value,
the bar it is held to (from the threshold version the gate used) and its outcome,
pass, fail or inconclusive; a one-line verdict in plain words comes first. Only
the threshold section that belongs to the gate is shown; the raw JSON stays
available behind a toggle on the page.

The shapes read here are the ones the gates write (``governance_loop/gates``);
a key that is missing gives no row rather than an error, so an older gate result
still renders.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from triloop.statuses import Gate

Outcome = Literal["pass", "fail", "inconclusive"]
RowOutcome = Literal["pass", "fail", "inconclusive", "context"]  # context: no bar of its own

# The gates that read the section of a threshold spec named after them (offline eval reads
# the top level).
SECTION_GATES = (Gate.SHADOW, Gate.CANARY, Gate.WATCH, Gate.STABILITY)
METRIC_WORDS = {"success_rate": "success rate", "mean_reward": "mean reward"}
HUMAN_GATES = (Gate.AUDIT, Gate.APPROVAL, Gate.PROMOTE)


@dataclass(frozen=True)
class Check:
    """One row of the analysis."""

    name: str
    measured: str
    bar: str
    outcome: RowOutcome
    note: str = ""


@dataclass(frozen=True)
class GateAnalysis:
    """The verdict in words, the checks behind it, and the gate's own thresholds."""

    outcome: Outcome
    verdict: str
    checks: list[Check] = field(default_factory=list)
    thresholds: dict[str, Any] = field(default_factory=dict)
    threshold_version: str | None = None
    waiting_for_traffic: bool = False


def _num(value: Any, digits: int = 3) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "—" if value is None else str(value)
    if isinstance(value, int):
        return str(value)
    return f"{value:.{digits}g}"


def _pct(value: Any) -> str:
    return f"{value * 100:.1f}%" if isinstance(value, int | float) else "—"


def _points(value: Any) -> str:
    return f"{value * 100:+.1f} points" if isinstance(value, int | float) else "—"


def _interval(value: Any, show: Any = _num) -> str:
    """``estimate [low, high]`` of a stats interval dict, or the plain value."""
    if not isinstance(value, Mapping):
        return str(show(value))
    low, high = value.get("low"), value.get("high")
    ci = f" [{show(low)}, {show(high)}]" if low is not None and high is not None else ""
    return f"{show(value.get('estimate'))}{ci}"


def _estimate(value: Any) -> float | None:
    found = value.get("estimate") if isinstance(value, Mapping) else value
    return float(found) if isinstance(found, int | float) else None


def relevant_thresholds(gate: str, spec: Mapping[str, Any] | None,
                        evidence: Mapping[str, Any]) -> dict[str, Any]:
    """The thresholds this gate is held to: its section of the threshold version, else the
    copy the gate wrote into its evidence."""
    if spec:
        if gate in SECTION_GATES and isinstance(spec.get(gate), Mapping):
            return dict(spec[gate])
        if gate == Gate.OFFLINE_EVAL:
            return {k: v for k, v in spec.items() if not isinstance(v, Mapping)
                    and k != "version"}
    copied = evidence.get("thresholds")
    return dict(copied) if isinstance(copied, Mapping) else {}


def _bar(thresholds: Mapping[str, Any], key: str) -> Any:
    return thresholds.get(key)


def _offline_checks(evidence: Mapping[str, Any], bars: Mapping[str, Any]) -> list[Check]:
    checks: list[Check] = []
    min_samples = _bar(bars, "min_samples")
    min_rate = _bar(bars, "min_success_rate")
    max_regression = _bar(bars, "max_regression_vs_production")
    max_reward = _bar(bars, "max_reward_regression_vs_production")
    for result in evidence.get("eval_sets") or []:
        if not isinstance(result, Mapping):
            continue
        name = str(result.get("eval_set", "eval set"))
        for arm in ("candidate", "production"):
            stats = result.get(arm)
            if isinstance(stats, Mapping) and isinstance(min_samples, int):
                episodes = int(stats.get("episodes") or 0)
                checks.append(Check(f"{name}: {arm} episodes", str(episodes),
                                    f"≥ {min_samples}",
                                    "pass" if episodes >= min_samples else "fail"))
        candidate = result.get("candidate")
        measured = candidate.get("success_rate") if isinstance(candidate, Mapping) else None
        rate = _estimate(measured)
        if rate is not None and isinstance(min_rate, int | float):
            checks.append(Check(f"{name}: candidate success rate", _interval(measured, _pct),
                                f"≥ {_pct(min_rate)}",
                                "pass" if rate >= min_rate else "fail"))
        delta = _estimate(result.get("success_rate_delta"))
        if delta is not None and isinstance(max_regression, int | float):
            checks.append(Check(f"{name}: success rate vs production",
                                _interval(result["success_rate_delta"], _points),
                                f"≥ {_points(-max_regression)}",
                                "pass" if delta >= -max_regression else "fail"))
        reward = _estimate(result.get("reward_delta"))
        if reward is not None and isinstance(max_reward, int | float):
            checks.append(Check(f"{name}: mean reward vs production",
                                _interval(result["reward_delta"]), f"≥ {_num(-max_reward)}",
                                "pass" if reward >= -max_reward else "fail"))
    return checks


def _shadow_checks(evidence: Mapping[str, Any], bars: Mapping[str, Any]) -> list[Check]:
    checks: list[Check] = []
    n = evidence.get("paired_episodes")
    min_samples = _bar(bars, "min_samples")
    if isinstance(n, int) and isinstance(min_samples, int):
        checks.append(Check("Paired production episodes", str(n), f"≥ {min_samples}",
                            "pass" if n >= min_samples else "inconclusive",
                            "" if n >= min_samples else "needs production traffic"))
    agreement = evidence.get("agreement_rate")
    floor = _bar(bars, "agreement_floor")
    if isinstance(floor, int | float):
        if isinstance(agreement, int | float):
            checks.append(Check("Action agreement with production", _pct(agreement),
                                f"≥ {_pct(floor)}", "pass" if agreement >= floor else "fail",
                                "a low agreement fails only with a significantly worse reward"))
        else:
            checks.append(Check("Action agreement with production", "—", f"≥ {_pct(floor)}",
                                "inconclusive", "no steps compared"))
    delta = _estimate(evidence.get("reward_delta"))
    max_drop = _bar(bars, "max_mean_reward_regression")
    if delta is not None and isinstance(max_drop, int | float):
        checks.append(Check("Mean reward, candidate − production",
                            _interval(evidence["reward_delta"]), f"≥ {_num(-max_drop)}",
                            "pass" if delta >= -max_drop else "fail"))
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
                                "inconclusive", "the arms' outcomes do not vary yet"))
            continue
        regressed = metric.get("log_evidence_regressed")
        boundary = metric.get("regressed_boundary")
        if isinstance(regressed, int | float) and isinstance(boundary, int | float):
            checks.append(Check(
                f"{prefix}{words}: evidence of a regression", _num(regressed),
                f"{abort_words} at ≥ {_num(boundary)}",
                "fail" if regressed >= boundary else "pass",
                "log e-value; higher means more evidence it is worse"))
        not_worse = metric.get("log_evidence_not_worse")
        pass_at = metric.get("not_worse_boundary")
        if with_not_worse and isinstance(not_worse, int | float) \
                and isinstance(pass_at, int | float):
            effect = metric.get("effect_to_detect")
            by = f" by {_pct(effect)}" if words == "success rate" else f" by {_num(effect)}"
            checks.append(Check(
                f"{prefix}{words}: evidence it is not worse{by if effect else ''}",
                _num(not_worse), f"pass at ≥ {_num(pass_at)}",
                "pass" if not_worse >= pass_at else "inconclusive",
                f"{_pct(metric.get('information_fraction'))} of the planned information"))
    return checks


def _arms_row(name: str, arms: Mapping[str, Any], bar: Any) -> Check | None:
    counts = {label: int(arm.get("episodes") or 0) for label, arm in arms.items()
              if isinstance(arm, Mapping)}
    if not counts or not isinstance(bar, int):
        return None
    measured = " · ".join(f"{label} {n}" for label, n in counts.items())
    enough = min(counts.values()) >= bar
    return Check(name, measured, f"≥ {bar} each", "pass" if enough else "inconclusive",
                 "" if enough else "needs production traffic")


def _rate_row(name: str, arms: tuple[Any, Any], delta: Any) -> Check | None:
    first, second = arms
    if not isinstance(first, Mapping) or not isinstance(second, Mapping):
        return None
    measured = (f"{_pct(first.get('success_rate'))} vs {_pct(second.get('success_rate'))}"
                f" ({_interval(delta, _points)})")
    return Check(name, measured, "—", "context", "judged by the tests below")


def _canary_checks(evidence: Mapping[str, Any], bars: Mapping[str, Any]) -> list[Check]:
    arms = {"canary": evidence.get("canary"), "production": evidence.get("production")}
    rows = [_arms_row("Episodes per arm", arms, _bar(bars, "min_samples_per_arm")),
            _rate_row("Success rate, canary vs production",
                      (evidence.get("canary"), evidence.get("production")),
                      evidence.get("success_rate_delta"))]
    checks = [r for r in rows if r is not None]
    tests = _sequential_rows(evidence.get("metrics"), "", abort_words="abort",
                             with_not_worse=True)
    if checks and checks[0].outcome == "inconclusive":
        # The canary aborts only once both arms have the minimum sample (gates.canary).
        tests = [replace(c, outcome="inconclusive", note=c.note + "; too few episodes to "
                         "act on") if c.outcome == "fail" else c for c in tests]
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
        row = _arms_row(f"{prefix}episodes", arms, _bar(bars, "min_samples"))
        checks += [row] if row is not None else []
        checks += _sequential_rows(found.get("metrics"), prefix, abort_words="roll back",
                                   with_not_worse=False)
    return checks


def _stability_checks(evidence: Mapping[str, Any], bars: Mapping[str, Any]) -> list[Check]:
    blocking = evidence.get("blocking_alarms")
    window = _bar(bars, "alarm_window_iterations")
    if not isinstance(blocking, list):
        return []
    within = f" in the last {window} iterations" if window is not None else ""
    kinds = ", ".join(sorted({str(a.get("kind", a)) if isinstance(a, Mapping) else str(a)
                              for a in blocking})).replace("_", " ")
    return [Check(f"Stability alarms{within} before the proposal",
                  str(len(blocking)) + (f" ({kinds})" if kinds else ""), "0",
                  "pass" if not blocking else "fail",
                  "an operator who did not submit the run may override them")]


CHECKS: dict[str, Callable[[Mapping[str, Any], Mapping[str, Any]], list[Check]]] = {
    Gate.OFFLINE_EVAL: _offline_checks, Gate.SHADOW: _shadow_checks,
    Gate.CANARY: _canary_checks, Gate.WATCH: _watch_checks, Gate.STABILITY: _stability_checks,
}


def _verdict(gate: str, passed: bool, checks: list[Check], reasons: list[str]) -> str:
    words = gate.replace("_", " ").capitalize()
    failed = [c for c in checks if c.outcome == "fail"]
    unsure = [c for c in checks if c.outcome == "inconclusive"]
    traffic = [c for c in unsure if c.note == "needs production traffic"]
    if passed:
        if not checks:
            return f"{words} passed: {reasons[0]}" if reasons else f"{words} passed."
        judged = [c for c in checks if c.outcome != "context"]
        return f"{words} passed: all {len(judged)} checks met their bars."
    if traffic and not failed:
        c = traffic[0]
        return (f"{words} did not see enough production traffic: {c.measured}, needs "
                f"{c.bar.removeprefix('≥ ')}. Shadow and canary judge real production "
                "episodes: send them (POST /api/episodes) and propose the candidate again.")
    if failed:
        shown = "; ".join(f"{c.name} {c.measured} (needs {c.bar})" for c in failed[:2])
        more = f" and {len(failed) - 2} more" if len(failed) > 2 else ""
        return f"{words} failed: {shown}{more}."
    if unsure:
        return f"{words} failed undecided: {unsure[0].name} stayed inconclusive."
    return f"{words} failed: {reasons[0]}" if reasons else f"{words} failed."


def analyse_gate(
    *, gate: str, passed: bool, reasons: list[str], evidence: Mapping[str, Any],
    threshold_spec: Mapping[str, Any] | None,
) -> GateAnalysis:
    """The analysis of one recorded gate result."""
    bars = relevant_thresholds(gate, threshold_spec, evidence)
    build = CHECKS.get(gate)
    checks = build(evidence, bars) if build is not None else []
    version = evidence.get("threshold_version") or (threshold_spec or {}).get("version")
    traffic = any(c.note == "needs production traffic" for c in checks)
    outcome: Outcome = "pass" if passed else (
        "inconclusive" if traffic and not any(c.outcome == "fail" for c in checks) else "fail")
    return GateAnalysis(outcome=outcome, verdict=_verdict(gate, passed, checks, reasons),
                        checks=checks, thresholds={} if gate in HUMAN_GATES else bars,
                        threshold_version=None if version is None else str(version),
                        waiting_for_traffic=traffic and not passed)


def waiting_gate_note(gate: str, threshold_spec: Mapping[str, Any] | None) -> str | None:
    """What an open promotion at a traffic-fed gate is waiting for, in words."""
    if gate not in ("shadow", "canary", "watch"):
        return None
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
