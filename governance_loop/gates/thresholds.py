"""Versioned gate thresholds: what a candidate must reach, recorded with every decision.

Success rates and regressions are fractions (0.02 means 2 percentage points);
rewards are in the environment's reward units. A ``ThresholdSpec`` is frozen once
governance stores it; a change is a new ``version``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from governance_loop.gates.behaviour_audit import signal_name_problem


class ThresholdSpecError(ValueError):
    """A threshold spec with a missing, unknown or out-of-range field."""


def _check_fraction(owner: str, name: str, value: float, *, allow_zero: bool = True) -> None:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    low_ok = number and (value >= 0 if allow_zero else value > 0)
    if not (number and math.isfinite(value) and low_ok and value <= 1):
        bound = "[0, 1]" if allow_zero else "(0, 1]"
        raise ThresholdSpecError(f"{owner}.{name} must be a fraction in {bound}, got {value!r}")


def _check_probability(owner: str, name: str, value: float) -> None:
    if not (isinstance(value, int | float) and 0 < value < 1):
        raise ThresholdSpecError(f"{owner}.{name} must be strictly between 0 and 1, got {value!r}")


def _check_positive(owner: str, name: str, value: float | None) -> None:
    if value is not None and not (
        isinstance(value, int | float) and math.isfinite(value) and value > 0
    ):
        raise ThresholdSpecError(f"{owner}.{name} must be a number > 0 or null, got {value!r}")


def _check_count(owner: str, name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ThresholdSpecError(f"{owner}.{name} must be an integer >= 1, got {value!r}")


@dataclass(frozen=True)
class ShadowSpec:
    """Shadow gate: candidate beside production on the same tasks, actions not applied."""

    # Paired episodes (same task, both policies) required before the gate can pass.
    min_samples: int = 50
    # Fraction of compared steps where candidate and production chose the same action.
    agreement_floor: float = 0.9
    # Two-sided confidence of the interval on the mean paired reward delta.
    confidence: float = 0.95
    # Guard, in reward units: a mean delta below -this fails even at high agreement.
    max_mean_reward_regression: float = 0.05

    def __post_init__(self) -> None:
        _check_count("shadow", "min_samples", self.min_samples)
        _check_fraction("shadow", "agreement_floor", self.agreement_floor)
        _check_probability("shadow", "confidence", self.confidence)
        if not self.max_mean_reward_regression >= 0:
            raise ThresholdSpecError("shadow.max_mean_reward_regression must be >= 0")


@dataclass(frozen=True)
class CanarySpec:
    """Canary gate: always-valid sequential tests, canary share vs the rest of production.

    The test is planned from ``regression_to_detect``, alpha and beta: the evidence
    of every look reports the episodes per arm that plan needs (``gates.sequential``).
    """

    # Episodes required in each arm before the test may decide anything (a floor for
    # the normal approximation, not the plan).
    min_samples_per_arm: int = 200
    # Absolute drop in success rate (fraction) the test is built to catch: H1 is p_c = p_p - this.
    regression_to_detect: float = 0.05
    # Alpha: chance of aborting a candidate that is as good as production.
    false_abort_rate: float = 0.05
    # Beta: chance of passing a candidate that is worse by regression_to_detect.
    missed_regression_rate: float = 0.10
    # Drop in mean episode reward (reward units) the canary is built to catch; the
    # reward test runs beside the success-rate test. None checks success rate only.
    reward_regression_to_detect: float | None = None
    # False: judge by mean reward alone, for tasks where success is too rare to inform a
    # test (a success rate of 0 in both arms is no evidence either way). Needs
    # reward_regression_to_detect, so the canary always tests something.
    check_success_rate: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.check_success_rate, bool):
            raise ThresholdSpecError(
                f"canary.check_success_rate must be true or false, got {self.check_success_rate!r}")
        if not self.check_success_rate and self.reward_regression_to_detect is None:
            raise ThresholdSpecError("canary.check_success_rate is false, so "
                                     "canary.reward_regression_to_detect must be set: the canary "
                                     "must test at least one metric")
        _check_count("canary", "min_samples_per_arm", self.min_samples_per_arm)
        _check_positive("canary", "reward_regression_to_detect", self.reward_regression_to_detect)
        _check_fraction("canary", "regression_to_detect", self.regression_to_detect,
                        allow_zero=False)
        _check_probability("canary", "false_abort_rate", self.false_abort_rate)
        _check_probability("canary", "missed_regression_rate", self.missed_regression_rate)


@dataclass(frozen=True)
class WatchSpec:
    """Watch after promotion: always-valid sequential tests against pre-promotion baselines."""

    # Episodes since promotion required before a rollback can be triggered.
    min_samples: int = 200
    # Absolute drop in success rate (fraction) that counts as a regression.
    regression_to_detect: float = 0.05
    # Alpha under continuous monitoring: chance of rolling back a non-regressed model,
    # shared by every baseline and metric the watch tests.
    false_rollback_rate: float = 0.05
    # Drop in mean episode reward (reward units) tolerated before rolling back, judged by
    # an always-valid test of "drop <= this"; None checks success rate only. Reward sees
    # regressions that success rate misses when successes are rare.
    max_reward_regression: float | None = None
    # Beta: chance of missing a regression of regression_to_detect; plans the sample size.
    missed_regression_rate: float = 0.10
    # Reward drop beyond max_reward_regression (reward units) the watch is built to catch;
    # None uses regression_to_detect (rewards on the scale of success, 0 to 1).
    reward_regression_to_detect: float | None = None

    def __post_init__(self) -> None:
        _check_count("watch", "min_samples", self.min_samples)
        if self.max_reward_regression is not None and (
            not math.isfinite(self.max_reward_regression) or self.max_reward_regression < 0
        ):
            raise ThresholdSpecError(
                f"watch.max_reward_regression must be a finite number >= 0, "
                f"got {self.max_reward_regression!r}"
            )
        _check_fraction("watch", "regression_to_detect", self.regression_to_detect,
                        allow_zero=False)
        _check_probability("watch", "false_rollback_rate", self.false_rollback_rate)
        _check_probability("watch", "missed_regression_rate", self.missed_regression_rate)
        _check_positive("watch", "reward_regression_to_detect", self.reward_regression_to_detect)


@dataclass(frozen=True)
class StabilitySpec:
    """Stability gate: the run that made the candidate must not have alarmed lately."""

    # Iterations (count) before and including the proposed one in which an echo-trap or
    # template-collapse alarm blocks the candidate until an operator overrides it; 0 lets
    # alarms through (they are still shown with the candidate).
    alarm_window_iterations: int = 5

    def __post_init__(self) -> None:
        value = self.alarm_window_iterations
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ThresholdSpecError(
                f"stability.alarm_window_iterations must be an integer >= 0, got {value!r}")


@dataclass(frozen=True)
class BehaviourAuditSpec:
    """Offline eval's shortcut audit: the candidate's behaviour beside production's on the
    same eval tasks (``gates.behaviour_audit``). A signal is flagged only when its shift
    is both large (the bounds below) and statistically clear (``confidence``)."""

    # A rate (a fraction of episodes or steps: termination causes, invalid actions, empty
    # and refusing answers, distinct answers) is flagged when it moves in its worrying
    # direction by more than this (absolute fraction: 0.1 = 10 points).
    max_rate_shift: float = 0.1
    # A length (mean turns, mean action tokens per episode) is flagged when its mean moves
    # either way by more than this share of production's mean (0.5 = 50%).
    max_length_shift: float = 0.5
    # Two-sided confidence the shift must be clear at: a two-proportion z-test for rates,
    # Welch's test for lengths, so a small sample is not flagged by noise.
    confidence: float = 0.95
    # Signal names (``termination/<cause>``, ``action_format/invalid_rate``, ...) that
    # fail offline eval when flagged; the others are shown to the auditor only.
    blocking: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_fraction("audit", "max_rate_shift", self.max_rate_shift, allow_zero=False)
        if self.max_length_shift is None:
            raise ThresholdSpecError("audit.max_length_shift must be a number > 0")
        _check_positive("audit", "max_length_shift", self.max_length_shift)
        _check_probability("audit", "confidence", self.confidence)
        blocking = self.blocking
        if isinstance(blocking, str) or not isinstance(blocking, list | tuple):
            raise ThresholdSpecError(
                f"audit.blocking must be a list of signal names, got {blocking!r}")
        problems = [p for p in map(signal_name_problem, blocking) if p is not None]
        if problems:
            raise ThresholdSpecError(f"audit.blocking: {'; '.join(problems)}")
        # Stored JSON holds a list; the frozen spec holds a tuple, so a round trip is equal.
        object.__setattr__(self, "blocking", tuple(blocking))


@dataclass(frozen=True)
class PlaceboSpec:
    """Offline eval's placebo control (``gates.placebo``): the candidate against the last
    checkpoint of a placebo run, its run's config trained with the task reward zeroed
    (``triloop train placebo RUN``). It costs a second run, so it is off by default."""

    # Always required, whatever alias the promotion moves.
    required: bool = False
    # Candidate success rate minus the placebo's, on every eval set (fraction of held-out
    # episodes: 0.05 = 5 points), at least this.
    margin: float = 0.05
    # Required when the promotion's target alias is one of these (e.g. ["production"]).
    required_for_aliases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.required, bool):
            raise ThresholdSpecError(
                f"placebo.required must be true or false, got {self.required!r}")
        if isinstance(self.margin, bool) or not isinstance(self.margin, int | float):
            raise ThresholdSpecError(
                f"placebo.margin must be a fraction in [0, 1], got {self.margin!r}")
        _check_fraction("placebo", "margin", self.margin)
        aliases = self.required_for_aliases
        if isinstance(aliases, str) or not isinstance(aliases, list | tuple) or not all(
                isinstance(a, str) and a.strip() for a in aliases):
            raise ThresholdSpecError(
                "placebo.required_for_aliases must be a list of alias names (e.g."
                f" [\"production\"]), got {aliases!r}")
        # Stored JSON holds a list; the frozen spec holds a tuple, so a round trip is equal.
        object.__setattr__(self, "required_for_aliases", tuple(aliases))

    def required_for(self, alias: str) -> bool:
        """Whether a promotion to ``alias`` must beat the placebo."""
        return self.required or alias in self.required_for_aliases


@dataclass(frozen=True)
class AttributionSpec:
    """Offline eval: a gain over production must come from the task, not from shaping.

    Each episode's reward is split by term (``verdict.details["terms"]``); only ``success``
    is the task (``governance_loop.gates.attribution``).
    """

    # Offline eval: when the candidate's mean reward beats the baseline's, at least this
    # share of the gain must come from the task term (`success`); None = not checked.
    min_task_share: float | None = 0.5
    # Offline eval: the mean reward must beat the baseline's by at least this (ε, reward
    # units); None = not required.
    min_reward_gain: float | None = None
    # Offline eval: the success rate must rise by at least this (fraction); None = not required.
    min_success_gain: float | None = None

    def __post_init__(self) -> None:
        for name in ("min_task_share", "min_success_gain"):
            value = getattr(self, name)
            if value is not None:
                _check_fraction("attribution", name, value)
        gain = self.min_reward_gain
        if gain is not None and not (
            isinstance(gain, int | float) and math.isfinite(gain) and gain >= 0
        ):
            raise ThresholdSpecError(
                f"attribution.min_reward_gain must be a number >= 0 or null, got {gain!r}")


@dataclass(frozen=True)
class ThresholdSpec:
    """One frozen version of every gate's thresholds."""

    # Identifies this frozen spec; every gate decision records it.
    version: str
    # Offline eval: candidate success rate (fraction) required on each eval set.
    min_success_rate: float
    # Offline eval: largest tolerated drop vs production in success rate (fraction).
    max_regression_vs_production: float
    # Offline eval: episodes required per eval set for each policy.
    min_samples: int
    # Offline eval: largest tolerated drop vs production in mean reward; None = not checked.
    max_reward_regression_vs_production: float | None = None
    # Two-sided confidence of the intervals reported in offline-eval evidence.
    confidence: float = 0.95
    shadow: ShadowSpec = field(default_factory=ShadowSpec)
    canary: CanarySpec = field(default_factory=CanarySpec)
    watch: WatchSpec = field(default_factory=WatchSpec)
    # Absent from specs stored before it existed: those get its defaults.
    stability: StabilitySpec = field(default_factory=StabilitySpec)
    audit: BehaviourAuditSpec = field(default_factory=BehaviourAuditSpec)
    placebo: PlaceboSpec = field(default_factory=PlaceboSpec)
    # On by default (min_task_share 0.5), also for specs stored before it existed.
    attribution: AttributionSpec = field(default_factory=AttributionSpec)

    def __post_init__(self) -> None:
        if not isinstance(self.version, str) or not self.version.strip():
            raise ThresholdSpecError("thresholds.version must be a non-empty string")
        _check_fraction("thresholds", "min_success_rate", self.min_success_rate)
        _check_fraction("thresholds", "max_regression_vs_production",
                        self.max_regression_vs_production)
        _check_count("thresholds", "min_samples", self.min_samples)
        _check_probability("thresholds", "confidence", self.confidence)
        reward = self.max_reward_regression_vs_production
        if reward is not None and not (math.isfinite(reward) and reward >= 0):
            raise ThresholdSpecError(
                f"thresholds.max_reward_regression_vs_production must be >= 0, got {reward!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, the inverse of ``from_mapping``."""
        return asdict(self)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> ThresholdSpec:
        """Build a spec from stored JSON, refusing unknown keys so typos cannot pass silently."""
        # Every nested section: a dataclass whose fields are its keys.
        nested: dict[str, type[Any]] = {
            "shadow": ShadowSpec, "canary": CanarySpec, "watch": WatchSpec,
            "stability": StabilitySpec, "audit": BehaviourAuditSpec, "placebo": PlaceboSpec,
            "attribution": AttributionSpec,
        }
        _refuse_unknown("thresholds", data, {f.name for f in fields(cls)})
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            spec_type = nested.get(key)
            if spec_type is None:
                kwargs[key] = value
                continue
            if not isinstance(value, Mapping):
                raise ThresholdSpecError(f"thresholds.{key} must be a mapping, got {value!r}")
            _refuse_unknown(key, value, {f.name for f in fields(spec_type)})
            kwargs[key] = spec_type(**value)
        try:
            return cls(**kwargs)
        except TypeError as exc:  # a required field is missing
            raise ThresholdSpecError(f"incomplete threshold spec: {exc}") from exc


def _refuse_unknown(owner: str, data: Mapping[str, Any], known: set[str]) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        raise ThresholdSpecError(f"{owner}: unknown fields {unknown}; known: {sorted(known)}")
