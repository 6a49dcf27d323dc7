"""The names of reward terms every loop agrees on (environments name the rest).

An environment MAY split a step's process reward (``StepResult.feedback["reward_terms"]``)
and an outcome's reward (``Outcome.details["reward_terms"]``) into named terms. The verifier
adds each episode's terms into ``verdict.details["terms"]``, summing to its total reward,
and puts what an environment left unnamed under the names below. The gates then ask where a
gain came from: only ``success``, the contract's reward for doing the task, is the task.
"""

from __future__ import annotations

TASK_TERM = "success"  # the contract's outcome term for doing the task (RewardSpec requires it)
UNNAMED_PROCESS = "process"  # step reward an environment did not name
UNNAMED_OUTCOME = "outcome"  # a failed episode's outcome reward an environment did not name
