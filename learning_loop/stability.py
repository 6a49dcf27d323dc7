"""Per-iteration stability metrics and the echo-trap and template-collapse detectors.

Two failure modes of multi-turn agent RL (RAGEN, Wang et al., 2025) hide behind a
reward curve that looks fine:

- **Echo trap**: the policy over-reinforces an early template; behaviour repeats,
  exploration dies. Signature over a window of iterations: the reward plateaus while the
  within-group reward variance falls, token entropy falls and the gradient norm rises.
- **Template collapse**: outputs stay diverse (entropy up) but stop depending on the
  input. Diversity under one input cannot see it; cross-input discrimination can: score
  each response against every prompt of the batch by teacher-forced log-likelihood; the
  share of responses whose own prompt scores highest (retrieval accuracy) falls to
  chance, 1/n, when the response no longer carries information about its prompt.

Everything here is pure python over plain numbers, so the detectors run anywhere; the
log-likelihood matrix itself comes from `learning_loop.objective.score_cross_input`.
Thresholds and windows live in `triloop.run_config.StabilityConfig`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Literal

from scipy import stats

from learning_loop.advantages import TrajectoryReturn, mean_and_std, within_group_reward_variances
from triloop.run_config import StabilityConfig


class StabilityInputError(ValueError):
    """Metrics that cannot be computed from what was given; the message says why."""


@dataclass(frozen=True)
class DiscriminationResult:
    """Cross-input discrimination of one batch."""

    accuracy: float  # share of responses whose own prompt scores highest (ties share credit)
    chance: float  # 1 / prompts
    prompts: int  # distinct prompts scored against each other


@dataclass(frozen=True)
class IterationMetrics:
    """The stability metrics of one iteration, as stored in `training_step`."""

    iteration: int
    reward_mean: float  # mean trajectory return (reward units)
    reward_variance: float  # population variance of trajectory returns over the batch
    within_group_reward_variance: float  # mean over groups of the variance inside each group
    zero_variance_group_share: float  # share of groups whose returns did not vary (0..1)
    token_entropy: float  # mean policy entropy per action token (nats)
    grad_norm: float | None  # pre-clip gradient L2 norm of the update (None: no step)
    kl: float | None  # KL to the reference per action token (nats), None without reference
    length_p50: float  # trajectory length in action tokens, median
    length_p90: float  # 90th percentile (linear interpolation)
    length_max: int  # longest trajectory (action tokens)
    retrieval_accuracy: float | None  # None when not measured this iteration
    retrieval_chance: float | None
    retrieval_prompts: int  # 0 when not measured

    def as_dict(self) -> dict[str, float | int | None]:
        """Plain dict for storage."""
        return asdict(self)


@dataclass(frozen=True)
class Alarm:
    """A detector's finding: what, when, a sentence for people and the numbers behind it."""

    kind: Literal["echo_trap", "template_collapse"]
    iteration: int
    message: str
    evidence: dict[str, float]


def percentile(values: Sequence[float], q: float) -> float:
    """q-th percentile (0..100) with linear interpolation between closest ranks."""
    if not values:
        raise StabilityInputError("percentile of no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def retrieval_accuracy(
    scores: Sequence[Sequence[float]], *, tie_tolerance: float = 1e-6
) -> DiscriminationResult:
    """Retrieval accuracy of an n x n matrix, scores[j][i] = log p(response j | prompt i).

    A response tied with k other prompts at the top earns 1/(k+1), so a policy that ignores
    its input scores exactly chance rather than whatever a tie-break would favour.
    """
    n = len(scores)
    if n < 2 or any(len(row) != n for row in scores):
        raise StabilityInputError(f"need a square matrix of at least 2 x 2, got {n} rows")
    credit = 0.0
    for j, row in enumerate(scores):
        best = max(row)
        if row[j] >= best - tie_tolerance:
            credit += 1.0 / sum(1 for s in row if s >= best - tie_tolerance)
    return DiscriminationResult(accuracy=credit / n, chance=1.0 / n, prompts=n)


def distinct_prompt_pairs(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]], limit: int
) -> tuple[list[list[int]], list[list[int]]]:
    """Up to `limit` (prompt, response) pairs with distinct prompts, first seen first.

    The G samples of a group share their prompt; scoring one response per distinct prompt
    keeps "its own prompt" well defined and the cost at limit^2 forward passes.
    """
    prompts: list[list[int]] = []
    responses: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    for prompt, response in pairs:
        key = tuple(prompt)
        if key in seen or len(prompts) >= limit:
            continue
        seen.add(key)
        prompts.append(list(prompt))
        responses.append(list(response))
    return prompts, responses


def iteration_metrics(
    *,
    iteration: int,
    returns: Sequence[TrajectoryReturn],
    trajectory_lengths: Sequence[int],
    token_entropy: float,
    grad_norm: float | None,
    kl: float | None,
    discrimination: DiscriminationResult | None,
) -> IterationMetrics:
    """Assemble one iteration's metrics from the batch and the update's measurements."""
    if not returns or not trajectory_lengths:
        raise StabilityInputError("an iteration needs at least one finished trajectory")
    reward_mean, reward_std = mean_and_std([r.total_reward for r in returns])
    variances = within_group_reward_variances(returns)
    lengths = [float(x) for x in trajectory_lengths]
    return IterationMetrics(
        iteration=iteration,
        reward_mean=reward_mean,
        reward_variance=reward_std**2,
        within_group_reward_variance=sum(variances) / len(variances),
        zero_variance_group_share=sum(v == 0.0 for v in variances) / len(variances),
        token_entropy=token_entropy,
        grad_norm=grad_norm,
        kl=kl,
        length_p50=percentile(lengths, 50),
        length_p90=percentile(lengths, 90),
        length_max=max(trajectory_lengths),
        retrieval_accuracy=discrimination.accuracy if discrimination else None,
        retrieval_chance=discrimination.chance if discrimination else None,
        retrieval_prompts=discrimination.prompts if discrimination else 0,
    )


def detect_echo_trap(
    history: Sequence[IterationMetrics], config: StabilityConfig | None = None
) -> Alarm | None:
    """Echo trap over the last `echo_window` iterations: reward plateau, falling
    within-group variance, falling entropy and rising gradient norm, all four at once."""
    config = config or StabilityConfig()
    window = list(history[-config.echo_window :])
    if len(window) < config.echo_window or any(m.grad_norm is None for m in window):
        return None
    reward_change = _fitted_change([m.reward_mean for m in window])
    variance = _relative_change([m.within_group_reward_variance for m in window])
    entropy = _relative_change([m.token_entropy for m in window])
    grad = _relative_change([m.grad_norm or 0.0 for m in window])
    if not (
        abs(reward_change) <= config.reward_plateau_tolerance
        and variance <= -config.variance_drop
        and entropy <= -config.entropy_drop
        and grad >= config.grad_norm_rise
    ):
        return None
    return Alarm(
        kind="echo_trap",
        iteration=window[-1].iteration,
        message=(
            f"echo trap over iterations {window[0].iteration}-{window[-1].iteration}: reward"
            f" flat ({reward_change:+.3f}), within-group variance {variance:+.0%}, entropy"
            f" {entropy:+.0%}, gradient norm {grad:+.0%}; the policy is repeating a template"
        ),
        evidence={
            "reward_change": reward_change,
            "within_group_variance_change": variance,
            "entropy_change": entropy,
            "grad_norm_change": grad,
            "window": float(len(window)),
        },
    )


def detect_template_collapse(
    metrics: IterationMetrics,
    config: StabilityConfig | None = None,
    *,
    history: Sequence[IterationMetrics] = (),
) -> Alarm | None:
    """Template collapse: retrieval accuracy within `retrieval_margin` of chance while
    token entropy stays at or above `collapse_min_entropy`.

    With `collapse_requires_prior_discrimination`, `history` (earlier iterations) must hold
    one that discriminated clearly, so a model that never depended on its input does not
    alarm on every iteration.
    """
    config = config or StabilityConfig()
    if not _near_chance(metrics, config):
        return None
    if metrics.token_entropy < config.collapse_min_entropy:
        return None
    if config.collapse_requires_prior_discrimination and not any(
        _discriminated(m, config) for m in history
    ):
        return None
    accuracy, chance = metrics.retrieval_accuracy or 0.0, metrics.retrieval_chance or 0.0
    return Alarm(
        kind="template_collapse",
        iteration=metrics.iteration,
        message=(
            f"template collapse at iteration {metrics.iteration}: responses pick out their own"
            f" prompt {accuracy:.0%} of the time (chance {chance:.0%}, {metrics.retrieval_prompts}"
            f" prompts) while entropy is {metrics.token_entropy:.2f} nats; outputs no longer"
            " depend on the input"
        ),
        evidence={
            "retrieval_accuracy": accuracy,
            "retrieval_chance": chance,
            "prompts": float(metrics.retrieval_prompts),
            "token_entropy": metrics.token_entropy,
        },
    )


def _near_chance(metrics: IterationMetrics, config: StabilityConfig) -> bool:
    accuracy, chance = metrics.retrieval_accuracy, metrics.retrieval_chance
    if accuracy is None or chance is None:
        return False
    if metrics.retrieval_prompts < config.min_discrimination_prompts:
        return False
    return accuracy <= chance + config.retrieval_margin


def _discriminated(metrics: IterationMetrics, config: StabilityConfig) -> bool:
    """Clearly discriminated: above chance + margin, and more than luck would explain.

    With few prompts a model that ignores its input still lands above chance + margin now
    and then (one lucky hit of 4 is 25 points); counting that as "once discriminated" made
    every later reading at chance an alarm. A one-sided binomial test of the hits against
    chance, at ``discrimination_alpha``, keeps such noise from arming the detector.
    """
    accuracy, chance = metrics.retrieval_accuracy, metrics.retrieval_chance
    if accuracy is None or chance is None:
        return False
    prompts = metrics.retrieval_prompts
    if prompts < config.min_discrimination_prompts or accuracy <= chance + config.retrieval_margin:
        return False
    hits = math.floor(accuracy * prompts + 1e-9)  # tied credit rounds down: no benefit of doubt
    return bool(stats.binomtest(hits, prompts, chance, alternative="greater").pvalue
                <= config.discrimination_alpha)


def _fitted_change(series: Sequence[float]) -> float:
    """Change across the series of its least-squares line (first to last point)."""
    n = len(series)
    x_mean, y_mean = (n - 1) / 2.0, sum(series) / n
    cov = sum((i - x_mean) * (y - y_mean) for i, y in enumerate(series))
    var = sum((i - x_mean) ** 2 for i in range(n))
    return cov / var * (n - 1)


def _relative_change(series: Sequence[float]) -> float:
    """Fitted change as a share of the series' mean magnitude (0 for an all-zero series)."""
    scale = abs(sum(series) / len(series))
    return _fitted_change(series) / scale if scale > 1e-12 else 0.0
