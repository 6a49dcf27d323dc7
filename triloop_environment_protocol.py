"""The environment-service protocol: what a served environment answers, in any language.

Version ``triloop-environment/1``; the OpenAPI document is
``docs/environment-service.openapi.json`` (the reference server's, checked by a test).

This file is published on its own: it imports the standard library and pydantic (>= 2)
and nothing of triloop, so a service written in Python copies this one file (or installs
it, ``pip install <triloop checkout>``, and imports ``triloop_environment_protocol``); a
test imports it with triloop's packages blocked. triloop's client and its kernel's
registration check import the same models, so what a service is told and what triloop
checks cannot drift apart. A service in another language generates its models from the
OpenAPI document.

| method and path | body | reply |
| --- | --- | --- |
| ``GET /info`` | | ``ServiceInfo``: task, capabilities, verifier digest |
| ``POST /episodes`` | ``ResetRequest`` | ``Observation`` with a new ``episode_id`` |
| ``POST /episodes/{id}/reset`` | ``ResetRequest`` | ``Observation`` |
| ``POST /episodes/{id}/step`` | ``StepRequest`` | ``StepReply`` |
| ``POST /episodes/{id}/verify`` | | ``Verdict``: success and details, on the service's side |
| ``DELETE /episodes/{id}`` | | 204 |
| ``POST /reference`` | ``ResetRequest`` | ``ReferenceReply``: admission's scripted solution |

The service never pays a reward for an outcome: it says whether the episode succeeded,
and triloop's verifier process turns that into the contract's outcome reward. Step
rewards are the contract's process terms the service names in ``StepReply.terms``.

Reward terms: triloop's built-in environments MAY name the terms of a step's process reward
in its feedback (``feedback["reward_terms"] = {term: value}``) and of an outcome reward in
its details (``details["reward_terms"]``), values summing to the reward. A served
environment names its step terms in ``StepReply.terms`` (each paid as the contract says);
its outcome reward is paid by triloop, so the verifier splits it into ``success`` (when the
episode succeeded) or ``outcome``. The gates compare candidates per term: a gain must come
from the task term ``success``, not only from shaping or process terms.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

PROTOCOL = "triloop-environment/1"


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ServiceCapabilities(_Message):
    """What the served environment implements (a contract is checked against it)."""

    actions: list[str]
    observations: list[str]
    success_criteria: list[str]
    outcome_terms: list[str]
    process_terms: list[str] = Field(default_factory=list)
    initial_state: list[str] = Field(default_factory=list)  # parameter names it reads


class ServiceInfo(_Message):
    """``GET /info``."""

    protocol: str = PROTOCOL
    task: str
    capabilities: ServiceCapabilities
    verifier_digest: str = Field(pattern=r"^[0-9a-f]{64}$")  # sha256 of its verifier code


class ResetRequest(_Message):
    """Start (or restart) an episode on a seed, under a contract's initial state."""

    seed: int
    initial_state: dict[str, Any] = Field(default_factory=dict)
    max_turns: int = Field(gt=0)


class Observation(_Message):
    """What the agent sees after a reset, and the state's fingerprint (admission's Q1)."""

    episode_id: str
    observation: str
    fingerprint: str  # any stable digest of the observable state


class StepRequest(_Message):
    """The model's raw text for one turn."""

    action: str


class StepReply(_Message):
    """One turn's result; ``terms`` name the contract's process reward terms earned."""

    observation: str
    done: bool
    terms: list[str] = Field(default_factory=list)
    feedback: dict[str, Any] = Field(default_factory=dict)
    fingerprint: str


class Verdict(_Message):
    """The service's verdict on the episode, reached on its side."""

    success: bool
    verifier_digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    details: dict[str, Any] = Field(default_factory=dict)


class ReferenceReply(_Message):
    """Scripted actions that solve the seed's episode."""

    actions: list[str]
