"""Validating a submitted RUN.yaml before anything is written or started.

The schema is the kernel's ``triloop.run_config``. A JSON object is validated as it
came (no round trip through YAML); YAML text is parsed with aliases refused. The result
is the typed ``RunConfig`` that the run's workflow and every update receive as is. This
is CPU work proportional to the input, so callers run it in the web service's
``ValidationPool``, never on the event loop.
"""

from __future__ import annotations

from typing import Any

from triloop.run_config import (
    ConfigProblem,
    RunConfig,
    RunConfigError,
    load_run_config,
    run_config_from_data,
)


def validate_run_config(*, config: dict[str, Any] | None, config_yaml: str | None) -> RunConfig:
    """Validate a JSON object or parse and validate YAML text; raises ``RunConfigError``."""
    if (config is None) == (config_yaml is None):
        raise RunConfigError([ConfigProblem("(body)",
                                            "give exactly one of 'config' or 'config_yaml'")])
    if config is not None:
        return run_config_from_data(config)
    return load_run_config(config_yaml or "")
