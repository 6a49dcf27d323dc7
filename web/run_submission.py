"""Validating a submitted RUN.yaml before anything is written or started.

The schema is the kernel's ``triloop.run_config``. A JSON object is validated as it
came (no round trip through YAML); YAML text is parsed with aliases refused. This
is CPU work proportional to the input, so callers run it in the web service's
``ValidationPool``, never on the event loop.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from triloop.run_config import RunConfigError, load_run_config, run_config_from_data


@dataclass(frozen=True)
class ValidRun:
    """A run config that passed validation, as plain JSON data, with what web needs of it."""

    name: str
    base: str
    task_ids: list[str]
    config: dict[str, Any]


class RunConfigInvalid(ValueError):
    """The config has problems; ``problems`` says where and what (``path: message``)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid run configuration: " + "; ".join(problems))
        self.problems = problems


def validate_run_config(*, config: dict[str, Any] | None, config_yaml: str | None) -> ValidRun:
    """Validate a JSON object or parse and validate YAML text; raises ``RunConfigInvalid``."""
    if (config is None) == (config_yaml is None):
        raise RunConfigInvalid(["(body): give exactly one of 'config' or 'config_yaml'"])
    try:
        parsed = (run_config_from_data(config) if config is not None
                  else load_run_config(config_yaml or ""))
    except RunConfigError as exc:
        raise RunConfigInvalid([f"{p.path}: {p.message}" for p in exc.problems]) from exc
    data: dict[str, Any] = parsed.model_dump(mode="json")
    try:
        json.dumps(data, allow_nan=False)
    except ValueError as exc:
        problem = "(body): numbers must be finite (NaN and Infinity are not JSON)"
        raise RunConfigInvalid([problem]) from exc
    return ValidRun(
        name=str(data["name"]), base=str(data["model"]["base"]),
        task_ids=[str(t) for t in data["rollout"]["task_ids"]], config=data,
    )
