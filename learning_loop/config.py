"""The run configuration lives in the shared kernel (``triloop.run_config``).

The web API validates a submitted RUN.yaml before any loop sees it, and the web
service may not import a loop, so the schema moved to the kernel; import it
from there.
"""

from triloop.run_config import (
    AdvantageConfig,
    ConfigProblem,
    ObjectiveConfig,
    OptimizerConfig,
    RunConfig,
    RunConfigError,
    StabilityConfig,
    UpdateConfig,
    load_run_config,
)

__all__ = [
    "AdvantageConfig",
    "ConfigProblem",
    "ObjectiveConfig",
    "OptimizerConfig",
    "RunConfig",
    "RunConfigError",
    "StabilityConfig",
    "UpdateConfig",
    "load_run_config",
]
