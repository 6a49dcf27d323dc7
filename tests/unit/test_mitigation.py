"""Mitigations on stability alarms: the decision, the settings the learner applies, the bonus."""

from __future__ import annotations

import pytest
import torch

from learning_loop.mitigation import MitigationState, decide_mitigation, with_mitigations
from learning_loop.objective import (
    ObjectiveInputError,
    differentiable_token_entropy,
    grpo_loss,
    token_entropy,
)
from learning_loop.update import build_optimizer, set_learning_rate
from triloop.run_config import (
    MitigationConfig,
    ObjectiveConfig,
    OptimizerConfig,
    RunConfig,
    run_config_from_data,
)


def test_no_alarm_or_no_mitigation_configured_changes_nothing() -> None:
    state = MitigationState()
    assert decide_mitigation(MitigationConfig(), state, alarmed=True, rollback_to="c0") is None
    on = MitigationConfig(on_alarm="raise_entropy")
    assert decide_mitigation(on, state, alarmed=False, rollback_to="c0") is None


def test_raise_entropy_adds_a_step_per_alarm_up_to_the_budget() -> None:
    config = MitigationConfig(on_alarm="raise_entropy", entropy_step=0.01, max_actions=2)
    first = decide_mitigation(config, MitigationState(), alarmed=True, rollback_to=None)
    assert first is not None and first.kind == "raise_entropy"
    second = decide_mitigation(config, first.state, alarmed=True, rollback_to=None)
    assert second is not None
    assert (second.state.actions, second.state.entropy_coef_bonus) == (2, pytest.approx(0.02))
    assert decide_mitigation(config, second.state, alarmed=True, rollback_to=None) is None


def test_lower_learning_rate_compounds_its_factor() -> None:
    config = MitigationConfig(on_alarm="lower_learning_rate", learning_rate_factor=0.5)
    first = decide_mitigation(config, MitigationState(), alarmed=True, rollback_to=None)
    assert first is not None
    second = decide_mitigation(config, first.state, alarmed=True, rollback_to=None)
    assert second is not None and second.state.learning_rate_scale == 0.25
    assert second.detail == {"learning_rate_scale": 0.25}


def test_rollback_names_the_checkpoint_before_the_alarm() -> None:
    config = MitigationConfig(on_alarm="rollback")
    action = decide_mitigation(config, MitigationState(), alarmed=True, rollback_to="parent")
    assert action is not None and action.detail == {"checkpoint_id": "parent"}
    # weights unchanged by the alarming update: nothing to roll back to
    assert decide_mitigation(config, MitigationState(), alarmed=True, rollback_to=None) is None


def test_the_learner_applies_the_mitigated_settings() -> None:
    config = run_config_from_data({"name": "r", "model": {"base": "m"},
                                   "rollout": {"task_ids": ["t"]},
                                   "optimizer": {"learning_rate": 1e-3}})
    assert with_mitigations(config, entropy_coef_bonus=0.0, learning_rate_scale=1.0) is config
    mitigated = with_mitigations(config, entropy_coef_bonus=0.02, learning_rate_scale=0.5)
    assert mitigated.objective.entropy_coef == pytest.approx(0.02)
    assert mitigated.optimizer.learning_rate == pytest.approx(5e-4)
    assert isinstance(mitigated, RunConfig)


def test_set_learning_rate_overrides_a_resumed_rate_and_keeps_the_warmup() -> None:
    model = torch.nn.Linear(2, 1)
    optimizer, scheduler = build_optimizer(model, OptimizerConfig(learning_rate=1e-2,
                                                                  warmup_steps=4))
    optimizer.step()
    scheduler.step()  # step 1 of 4: lr = 1e-2 * 2/4
    set_learning_rate(optimizer, scheduler, 1e-3)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(5e-4)
    optimizer.step()
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(7.5e-4)


def test_the_entropy_bonus_pushes_toward_higher_entropy() -> None:
    torch.manual_seed(0)
    logits = torch.randn(1, 3, 5, requires_grad=True)
    input_ids = torch.tensor([[0, 1, 2]])
    mask = torch.ones(1, 2)
    logprobs = torch.log_softmax(logits[:, :-1], -1).gather(-1, input_ids[:, 1:, None])[..., 0]
    args = (logprobs, logprobs.detach(), torch.zeros(1), mask)
    entropy = differentiable_token_entropy(logits)
    out = grpo_loss(*args, ObjectiveConfig(entropy_coef=0.1), entropy=entropy)
    # zero advantage: the loss is the bonus alone, -0.1 * mean entropy
    assert float(out.loss.detach()) == pytest.approx(-0.1 * float(entropy.detach().mean()),
                                                     rel=1e-5)
    (grad,) = torch.autograd.grad(out.loss, logits)
    stepped = logits.detach() - 1.0 * grad
    assert float(token_entropy(stepped).mean()) > float(token_entropy(logits.detach()).mean())
    with pytest.raises(ObjectiveInputError, match="differentiable entropy"):
        grpo_loss(*args, ObjectiveConfig(entropy_coef=0.1), entropy=token_entropy(logits))
