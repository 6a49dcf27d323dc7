"""Mitigations on stability alarms: what the run changes itself when an alarm fires.

Pure and torch-free (the training workflow calls it). On an iteration that raised an
echo-trap or template-collapse alarm, per ``mitigation.on_alarm``:

- ``raise_entropy``: the entropy bonus grows by ``entropy_step`` (more exploration, the
  usual answer to an echo trap's falling entropy and within-group variance);
- ``lower_learning_rate``: the learning rate is multiplied by ``learning_rate_factor``
  (smaller steps when the gradient norm climbs);
- ``rollback``: the run goes on from the checkpoint before the alarm (the alarming
  iteration's parent); rollouts in flight from the alarmed policy are cancelled.

At most ``max_actions`` per run; later alarms only alarm. Each action is recorded as a
``stability_mitigation`` audit event on the run before it takes effect, and the changed
settings travel with every later update (``UpdateInput.entropy_coef_bonus``,
``learning_rate_scale``), so the learner never reads a setting the run config does not
name. Pausing (``stability.pause_on_alarm``) is independent: a run may mitigate and pause.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from triloop.run_config import MitigationConfig, RunConfig


@dataclass(frozen=True)
class MitigationState:
    """What earlier mitigations changed (carried across continue-as-new)."""

    actions: int = 0  # mitigations taken so far (count)
    entropy_coef_bonus: float = 0.0  # added to objective.entropy_coef (unitless)
    learning_rate_scale: float = 1.0  # multiplies optimizer.learning_rate (unitless)


@dataclass(frozen=True)
class MitigationAction:
    """One decided mitigation: its kind, the state after it, and what it changes."""

    kind: str  # raise_entropy | lower_learning_rate | rollback
    state: MitigationState
    detail: dict[str, float | str]


def decide_mitigation(
    config: MitigationConfig, state: MitigationState, *, alarmed: bool,
    rollback_to: str | None,
) -> MitigationAction | None:
    """The mitigation for an update that ``alarmed``, or None (none configured, budget
    spent, or nothing to roll back to)."""
    if not alarmed or config.on_alarm == "none" or state.actions >= config.max_actions:
        return None
    taken = replace(state, actions=state.actions + 1)
    if config.on_alarm == "raise_entropy":
        bonus = state.entropy_coef_bonus + config.entropy_step
        return MitigationAction("raise_entropy", replace(taken, entropy_coef_bonus=bonus),
                                {"entropy_coef_bonus": bonus})
    if config.on_alarm == "lower_learning_rate":
        scale = state.learning_rate_scale * config.learning_rate_factor
        return MitigationAction("lower_learning_rate",
                                replace(taken, learning_rate_scale=scale),
                                {"learning_rate_scale": scale})
    if rollback_to is None:
        return None
    return MitigationAction("rollback", taken, {"checkpoint_id": rollback_to})


def with_mitigations(config: RunConfig, *, entropy_coef_bonus: float,
                     learning_rate_scale: float) -> RunConfig:
    """The run config as the learner applies it after mitigations."""
    if entropy_coef_bonus == 0.0 and learning_rate_scale == 1.0:
        return config
    objective = config.objective.model_copy(
        update={"entropy_coef": min(1.0, config.objective.entropy_coef + entropy_coef_bonus)})
    optimizer = config.optimizer.model_copy(
        update={"learning_rate": config.optimizer.learning_rate * learning_rate_scale})
    return config.model_copy(update={"objective": objective, "optimizer": optimizer})
