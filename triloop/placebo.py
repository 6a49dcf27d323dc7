"""The reward placebo control: a run's own config with its task reward zeroed (pure).

The Reward Placebo Trial asks whether a run's gain needs its task signal: the same config
(model, tasks, optimizer, seed) trained with the task term removed from every return
(``advantage.zero_task_reward``) gives a placebo checkpoint, and a candidate must beat it
on held-out success. The web service submits a placebo with ``placebo_config``;
governance finds a candidate's placebo with ``is_placebo_of``. Both compare stored run
configs, validated again so that a config stored before a setting existed compares with
its default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from triloop.run_config import RunConfigError, run_config_from_data

PLACEBO_SUFFIX = " (placebo)"
NAME_LIMIT = 200  # RunConfig.name's max_length
PLACEBO_COMMAND = "triloop train placebo"


def placebo_name(name: str) -> str:
    """``<name> (placebo)``, within the run name's length limit."""
    return name[:NAME_LIMIT - len(PLACEBO_SUFFIX)] + PLACEBO_SUFFIX


def placebo_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The placebo of a stored run config: the same settings (seed included), its name
    marked, ``advantage.zero_task_reward`` true. Raises RunConfigError if it is invalid."""
    run = run_config_from_data(dict(config))
    advantage = run.advantage.model_copy(update={"zero_task_reward": True})
    placebo = run.model_copy(update={"name": placebo_name(run.name), "advantage": advantage})
    return placebo.model_dump(mode="json")


def is_placebo(config: Mapping[str, Any]) -> bool:
    """Whether a stored run config is a placebo run's (``advantage.zero_task_reward`` on)."""
    advantage = config.get("advantage")
    return isinstance(advantage, Mapping) and advantage.get("zero_task_reward") is True


def _compared(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """What must match between a run and its placebo: everything but the name and the
    placebo switch (None: not a valid run config, so nothing is its placebo)."""
    try:
        data = run_config_from_data(dict(config)).model_dump(mode="json")
    except RunConfigError:
        return None
    data.pop("name")
    data["advantage"].pop("zero_task_reward")
    return data


def is_placebo_of(candidate: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    """True when ``other`` is a placebo run of ``candidate``'s config: zero_task_reward on,
    every other setting but the name equal."""
    mine, theirs = _compared(candidate), _compared(other)
    if mine is None or theirs is None:
        return False
    return is_placebo(other) and mine == theirs
