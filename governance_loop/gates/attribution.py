"""Reward attribution: where a candidate's change in mean reward came from, term by term.

The verifier splits every episode's total reward by term (``verdict.details["terms"]``,
summing to ``total_reward``). Over a set of episodes each term has a mean; the candidate's
mean less the baseline's is the term's delta, and the deltas sum to the change in mean
reward. Each term has a kind (``term_kind``):
- ``task``: the contract's ``success`` term, the one reward for doing the task;
- ``process``: a per-step term (the contract's process terms, and ``process``, the step
  reward an environment left unnamed);
- ``shaping``: every other outcome term (``failure``, ``progress``, ``outcome``).

The gain is *shaping only* when mean reward rose but the task term's share of the rise,
``task_share = task_delta / reward_delta``, is below ``min_task_share`` (half, when the
threshold does not check it): a policy that learned to collect shaping or format reward,
not to do the task (the demo's candidate: progress up, goals 0 → 1 of 64, holes 5 → 16).

Offline eval's refusals (``AttributionSpec``, on each eval set with a baseline), in order:
- ``min_reward_gain``: mean reward did not rise by at least ε;
- ``min_success_gain``: the success rate did not rise by at least that much;
- ``min_task_share``: mean reward rose, but less than that share of the rise is the task's;
  the reason names the terms the rise came from. Lower ``min_task_share`` (or set it to
  null) in a new threshold version to accept such a gain on purpose.
Shadow and canary record the same attribution without refusing anything.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from governance_loop.gates.stats import evidence_number
from governance_loop.gates.thresholds import AttributionSpec
from triloop.reward_terms import TASK_TERM, UNNAMED_OUTCOME, UNNAMED_PROCESS

# A rise in mean reward smaller than this is no rise: means of equal rewards differ by
# rounding only.
NO_CHANGE = 1e-9
# The task share under which a gain is called shaping only when no threshold says.
DEFAULT_SHAPING_SHARE = 0.5

EpisodeTerms = Mapping[str, float]


def term_kind(term: str, process_terms: Collection[str]) -> str:
    """``task`` for ``success``; ``process`` for a step term; ``shaping`` for the rest."""
    if term == TASK_TERM:
        return "task"
    if term == UNNAMED_PROCESS or term in process_terms:
        return "process"
    return "shaping"


def verdict_terms(terms: Any, *, success: bool, total_reward: float) -> dict[str, float]:
    """An episode's terms from its verdict; a verdict recorded before the verifier split
    rewards has none, and its whole reward is read as unnamed outcome reward (the verifier's
    own rule): ``success`` when it succeeded, else ``outcome``."""
    if isinstance(terms, Mapping):
        return {str(k): float(v) for k, v in terms.items() if isinstance(v, int | float)}
    return {TASK_TERM if success else UNNAMED_OUTCOME: float(total_reward)}


def mean_terms(episodes: Sequence[EpisodeTerms]) -> dict[str, float]:
    """Each term's mean over the episodes (an episode without a term earned 0 of it)."""
    totals: dict[str, float] = {}
    for episode in episodes:
        for term, value in episode.items():
            totals[term] = totals.get(term, 0.0) + value
    return {term: total / len(episodes) for term, total in totals.items()} if episodes else {}


@dataclass(frozen=True)
class TermDelta:
    """One term's mean for the candidate and the baseline (None: no baseline)."""

    term: str
    kind: str
    candidate: float
    baseline: float | None

    @property
    def delta(self) -> float | None:
        return None if self.baseline is None else self.candidate - self.baseline


@dataclass(frozen=True)
class Attribution:
    """Per-term means and deltas, and how much of the change in reward is the task's."""

    baseline: str | None  # what the candidate is compared with ("production"), or None
    terms: tuple[TermDelta, ...]
    success_rate_delta: float | None
    shaping_share: float  # the task share below which a rise is shaping only

    @property
    def reward_delta(self) -> float | None:
        if self.baseline is None:
            return None
        return sum(t.delta or 0.0 for t in self.terms)

    @property
    def task_delta(self) -> float | None:
        if self.baseline is None:
            return None
        return sum(t.delta or 0.0 for t in self.terms if t.kind == "task")

    @property
    def task_share(self) -> float | None:
        """The task term's share of a rise in mean reward (None when reward did not rise)."""
        reward, task = self.reward_delta, self.task_delta
        if reward is None or task is None or reward <= NO_CHANGE:
            return None
        return task / reward

    @property
    def shaping_only(self) -> bool:
        share = self.task_share
        return share is not None and share < self.shaping_share

    def gaining_terms(self) -> list[TermDelta]:
        """The terms other than the task's that rose, largest rise first."""
        rose = [t for t in self.terms if t.kind != "task" and (t.delta or 0.0) > NO_CHANGE]
        return sorted(rose, key=lambda t: (-(t.delta or 0.0), t.term))

    def to_dict(self, violations: Sequence[str] = ()) -> dict[str, Any]:
        """The evidence shape (``evidence["eval_sets"][i]["attribution"]``)."""
        return {
            "baseline": self.baseline,
            "terms": [{"term": t.term, "kind": t.kind,
                       "candidate": evidence_number(t.candidate),
                       "baseline": evidence_number(t.baseline),
                       "delta": evidence_number(t.delta)} for t in self.terms],
            "reward_delta": evidence_number(self.reward_delta),
            "task_delta": evidence_number(self.task_delta),
            "task_share": evidence_number(self.task_share),
            "success_rate_delta": evidence_number(self.success_rate_delta),
            "shaping_only": self.shaping_only,
            "violations": list(violations),
        }


def attribute(
    candidate: Sequence[EpisodeTerms], baseline: Sequence[EpisodeTerms] | None, *,
    process_terms: Collection[str], success_rate_delta: float | None = None,
    baseline_name: str = "production", min_task_share: float | None = None,
) -> Attribution:
    """Compare the candidate's per-term means with the baseline's (None: no baseline)."""
    mine = mean_terms(candidate)
    theirs = None if baseline is None else mean_terms(baseline)
    names = sorted(set(mine) | set(theirs or {}),
                   key=lambda t: (term_kind(t, process_terms) != "task", t))
    rows = tuple(TermDelta(term=t, kind=term_kind(t, process_terms), candidate=mine.get(t, 0.0),
                           baseline=None if theirs is None else theirs.get(t, 0.0))
                 for t in names)
    return Attribution(
        baseline=None if baseline is None else baseline_name, terms=rows,
        success_rate_delta=None if baseline is None else success_rate_delta,
        shaping_share=DEFAULT_SHAPING_SHARE if min_task_share is None else min_task_share)


def _signed(value: float) -> str:
    return f"{value:+.3g}"


def attribution_violations(found: Attribution, spec: AttributionSpec, *, eval_set: str,
                           version: str) -> list[str]:
    """Offline eval's refusals of one eval set's attribution (none without a baseline)."""
    reward, success = found.reward_delta, found.success_rate_delta
    if reward is None:
        return []
    where, why = f"eval set {eval_set!r}", f"(thresholds {version})"
    violations: list[str] = []
    if spec.min_reward_gain is not None and reward < spec.min_reward_gain:
        violations.append(f"{where}: mean reward changed {_signed(reward)} against "
                          f"{found.baseline}, min_reward_gain is {spec.min_reward_gain:.4g} {why}")
    if spec.min_success_gain is not None and (success is None
                                              or success < spec.min_success_gain):
        change = "unknown" if success is None else f"{success * 100:+.1f} points"
        violations.append(f"{where}: success rate changed {change} against {found.baseline}, "
                          f"min_success_gain is {spec.min_success_gain * 100:.1f} points {why}")
    share = found.task_share
    if spec.min_task_share is not None and share is not None and share < spec.min_task_share:
        task = found.task_delta or 0.0
        others = ", ".join(f"{t.term} ({_signed(t.delta or 0.0)})" for t in found.gaining_terms())
        violations.append(
            f"{where}: mean reward rose {reward:.3g}, but only {max(share, 0.0) * 100:.1f}% of "
            f"the gain came from the task term '{TASK_TERM}' ({_signed(task)}; min_task_share "
            f"{spec.min_task_share * 100:.0f}%): the gain is from shaping terms "
            f"{others or 'none (the task term fell)'} {why}")
    return violations
