"""Validating a submitted RUN.yaml before anything is written or started.

The schema is the kernel's ``triloop.run_config`` (``load_run_config``); until
that module exists the web service falls back to a minimal local check of the
fields it needs itself (name, model.base, rollout.task_ids) and leaves the rest
to the learning loop, which validates again.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError


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


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")
    base: str = Field(min_length=1)


class _Rollout(BaseModel):
    model_config = ConfigDict(extra="allow")
    task_ids: list[str] = Field(min_length=1)


class _PlaceholderRunConfig(BaseModel):
    """Only what web relies on; used while ``triloop.run_config`` is not in the kernel."""

    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1, max_length=200)
    model: _Model
    rollout: _Rollout


def _kernel() -> ModuleType | None:
    try:
        return importlib.import_module("triloop.run_config")
    except ModuleNotFoundError:
        return None


def validate_run_config(*, config: dict[str, Any] | None, config_yaml: str | None) -> ValidRun:
    """Parse (JSON object or YAML text) and validate; raises ``RunConfigInvalid``."""
    if (config is None) == (config_yaml is None):
        raise RunConfigInvalid(["(body): give exactly one of 'config' or 'config_yaml'"])
    # JSON is YAML, so one text path validates both forms the same way.
    text = config_yaml if config_yaml is not None else json.dumps(config)
    kernel = _kernel()
    if kernel is not None:
        try:
            parsed = kernel.load_run_config(text)
        except kernel.RunConfigError as exc:
            raise RunConfigInvalid([f"{p.path}: {p.message}" for p in exc.problems]) from exc
        data: dict[str, Any] = parsed.model_dump(mode="json")
    else:
        data = _placeholder(text)
    try:
        json.dumps(data, allow_nan=False)
    except ValueError as exc:
        problem = "(body): numbers must be finite (NaN and Infinity are not JSON)"
        raise RunConfigInvalid([problem]) from exc
    return ValidRun(
        name=str(data["name"]), base=str(data["model"]["base"]),
        task_ids=[str(t) for t in data["rollout"]["task_ids"]], config=data,
    )


def _placeholder(text: str) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RunConfigInvalid([f"(yaml): not valid YAML: {exc}"]) from exc
    if not isinstance(raw, dict):
        raise RunConfigInvalid(["(root): expected a mapping of sections"])
    try:
        return _PlaceholderRunConfig.model_validate(raw).model_dump(mode="json")
    except ValidationError as exc:
        problems = [
            f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}"
            for e in exc.errors(include_url=False)
        ]
        raise RunConfigInvalid(problems) from exc
