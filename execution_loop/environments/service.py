"""A served environment behind the ``Environment`` interface: triloop's client of the protocol.

A contract with a ``service`` section names the service's base URL; this client adapts
it, so the episode runner, the admission probe and the reward-hack probe use it as any
other environment. On opening, ``GET /info`` must name the contract's task and protocol,
declare the pinned verifier digest, and support what the contract asks for. Verification
runs ``service_verifier`` in triloop's verifier process (through the sandbox, like every
verifier, so admission sees it ran out of process), which asks the service for its
verdict: never the worker, and never the agent.

Errors talking to the service are infrastructure (``ServiceUnavailable``, retried like a
sandbox failure); a service that breaks the protocol is a ``ServiceProtocolError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from execution_loop.environments.base import (
    REWARD_TERMS,
    EnvironmentStateError,
    EnvironmentUnavailable,
    Outcome,
    StepResult,
    refuse_item,
)
from execution_loop.environments.service_protocol import (
    Observation,
    ReferenceReply,
    ResetRequest,
    ServiceInfo,
    StepReply,
    StepRequest,
)
from execution_loop.verification import VerifierRequest, run_verifier
from triloop.contract_checks import capability_problems
from triloop.contracts import ContractError, ServiceSpec
from triloop.service_contact import info_mismatches, served_capabilities

if TYPE_CHECKING:
    from execution_loop.sandbox import SandboxBackend
    from triloop.contracts import EnvironmentContract

VERIFIER = "execution_loop.environments.service_verifier:verify"
_Reply = TypeVar("_Reply", bound=BaseModel)


class ServiceUnavailable(EnvironmentUnavailable):
    """The environment service could not be reached or failed: infrastructure, retried."""


class ServiceProtocolError(RuntimeError):
    """The service answered, but not as the protocol says (or not for this contract)."""


def _spec(contract: EnvironmentContract) -> ServiceSpec:
    if contract.service is None:
        raise ValueError(f"contract for {contract.task!r} names no service")
    return contract.service


def _call(client: httpx.Client, method: str, path: str, reply: type[_Reply],
          body: BaseModel | None = None) -> _Reply:
    try:
        response = client.request(method, path, json=body.model_dump() if body else None)
    except httpx.HTTPError as exc:
        raise ServiceUnavailable(f"environment service {client.base_url}{path}: {exc}") from exc
    if response.status_code >= 500:
        raise ServiceUnavailable(f"environment service {client.base_url}{path} answered "
                                 f"{response.status_code}: {response.text[:500]}")
    if response.status_code >= 400:
        raise ServiceProtocolError(f"environment service {client.base_url}{path} refused "
                                   f"({response.status_code}): {response.text[:500]}")
    try:
        return reply.model_validate(response.json())
    except (ValidationError, ValueError) as exc:
        raise ServiceProtocolError(f"environment service {client.base_url}{path} broke the "
                                   f"protocol: {exc}") from exc


def check_service(contract: EnvironmentContract, info: ServiceInfo) -> None:
    """Refuse a service that is not the one the contract pins, or cannot honour it.

    The same checks as registration's (``triloop.service_contact``): a service that changed
    since it was registered is refused here, at every open.
    """
    spec = _spec(contract)
    wrong = info_mismatches(contract, info)
    if wrong:
        raise ServiceProtocolError(f"environment service {spec.url}: "
                                   + "; ".join(message for _, message in wrong))
    problems = capability_problems(
        contract.model_dump(mode="json"), {contract.task: served_capabilities(info)},
        frozenset(type(contract.success_criteria).model_fields), lambda _loc: None,
    )
    if problems:
        raise ContractError(problems, source=f"for the service at {spec.url}")


def open_client(contract: EnvironmentContract) -> httpx.Client:
    """An HTTP client for the contract's service (closed by the environment)."""
    spec = _spec(contract)
    return httpx.Client(base_url=spec.url.rstrip("/"), timeout=spec.timeout_s)


class ServiceEnvironment:
    """One episode at a time on a served environment."""

    def __init__(
        self, contract: EnvironmentContract, *, sandbox: SandboxBackend | None = None
    ) -> None:
        self.contract = contract
        self._spec = _spec(contract)
        self._sandbox = sandbox
        self._client = open_client(contract)
        try:
            check_service(contract, _call(self._client, "GET", "/info", ServiceInfo))
        except Exception:
            self._client.close()
            raise
        self._episode: str | None = None
        self._fingerprint: str | None = None
        self._done = False

    def _reset_request(self, seed: int) -> ResetRequest:
        return ResetRequest(seed=seed, initial_state=dict(self.contract.initial_state),
                            max_turns=self.contract.limits.max_turns)

    def reset(self, seed: int, item: Mapping[str, Any] | None = None) -> str:
        """Start an episode on the service (the same episode id after the first).

        The protocol's reset carries a seed, not an item: a served task is its seed.
        """
        refuse_item(f"environment service {self.contract.task}", item)
        body = self._reset_request(seed)
        if self._episode is None:
            reply = _call(self._client, "POST", "/episodes", Observation, body)
        else:
            reply = _call(self._client, "POST", f"/episodes/{self._episode}/reset",
                          Observation, body)
        self._episode, self._fingerprint, self._done = reply.episode_id, reply.fingerprint, False
        return reply.observation

    def step(self, action: str) -> StepResult:
        """Send the model's text; the process reward is the contract's terms the service names."""
        if self._episode is None or self._done:
            raise EnvironmentStateError("call reset(seed) before step, and not after the end")
        reply = _call(self._client, "POST", f"/episodes/{self._episode}/step", StepReply,
                      StepRequest(action=action))
        unknown = sorted(set(reply.terms) - set(self.contract.reward.process))
        process = self.contract.reward.process
        reward = sum(process[t] for t in reply.terms if t in process)
        paid: dict[str, float] = {}
        for term in reply.terms:
            if term in process:
                paid[term] = paid.get(term, 0.0) + process[term]
        # The split is triloop's (what the contract pays), whatever the service's feedback says.
        feedback: dict[str, Any] = {**reply.feedback, "terms": reply.terms, REWARD_TERMS: paid}
        if unknown:
            feedback["unpaid_terms"] = unknown  # the contract names the terms that pay
        self._fingerprint, self._done = reply.fingerprint, reply.done
        return StepResult(reply.observation, float(reward), reply.done, feedback)

    def verifier_request(self) -> VerifierRequest:
        """What triloop's verifier process needs to ask the service for its verdict."""
        if self._episode is None:
            raise EnvironmentStateError("call reset(seed) first")
        payload = {"url": self._spec.url, "episode_id": self._episode,
                   "verifier_digest": self._spec.verifier_digest,
                   "timeout_s": self._spec.timeout_s,
                   "reward": dict(self.contract.reward.outcome)}
        return VerifierRequest(VERIFIER, payload)

    def outcome(self) -> Outcome:
        """The service's verdict, fetched and checked in triloop's verifier process."""
        return run_verifier(self.verifier_request(), sandbox=self._sandbox)

    def state_fingerprint(self) -> str:
        """The fingerprint the service sent with its last reply."""
        if self._fingerprint is None:
            raise EnvironmentStateError("call reset(seed) first")
        return self._fingerprint

    def close(self) -> None:
        """End the episode on the service and close the connection."""
        try:
            if self._episode is not None:
                self._client.delete(f"/episodes/{self._episode}")
        except httpx.HTTPError:
            pass  # the service forgets unfinished episodes on its own; nothing to recover
        finally:
            self._episode = None
            self._client.close()


def reference_solution(
    seed: int, contract: EnvironmentContract, item: Mapping[str, Any] | None = None
) -> list[str]:
    """The service's scripted solution for the seed (admission's k-of-k runs)."""
    refuse_item(f"environment service {contract.task}", item)
    with open_client(contract) as client:
        body = ResetRequest(seed=seed, initial_state=dict(contract.initial_state),
                            max_turns=contract.limits.max_turns)
        return _call(client, "POST", "/reference", ReferenceReply, body).actions
