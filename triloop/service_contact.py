"""An environment service asked who it is (``GET /info``) before its contract is trusted.

``triloop env validate`` and governance's registration both call ``contact_problems``: a
contract with a ``service`` section is checked against what the service at its URL says
(the protocol, the task, the verifier digest the contract pins, and the capabilities the
contract uses). A wrong URL, an unreachable service or a digest mismatch is a problem
naming the URL, so it shows up at registration and never first at admission. The models
are the protocol's standalone module, the same ones an outside service imports; the
execution loop's client (``execution_loop.environments.service``) applies the same checks
(``info_mismatches``, ``served_capabilities``) every time it opens the environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx
from pydantic import ValidationError

from triloop.contract_checks import ContractProblem, capability_problems
from triloop.contracts import EnvironmentContract, ServiceSpec
from triloop_environment_protocol import PROTOCOL, ServiceInfo

# Registration waits this long at most for GET /info, whatever the contract's timeout.
CONTACT_TIMEOUT_S = 10.0


class ServiceContactError(RuntimeError):
    """The service at the contract's URL could not be asked, or did not answer the protocol."""


@dataclass(frozen=True)
class ServedCapabilities:
    """What ``GET /info`` declares, in the shape a contract is checked against."""

    actions: frozenset[str]
    observations: frozenset[str]
    success_criteria: frozenset[str]
    outcome_terms: frozenset[str]
    process_terms: frozenset[str]
    initial_state: Mapping[str, tuple[type, ...]] = field(default_factory=dict)
    required_state: frozenset[str] = frozenset()


def served_capabilities(info: ServiceInfo) -> ServedCapabilities:
    """The served environment's capabilities (initial-state values: any scalar)."""
    caps = info.capabilities
    return ServedCapabilities(
        actions=frozenset(caps.actions), observations=frozenset(caps.observations),
        success_criteria=frozenset(caps.success_criteria),
        outcome_terms=frozenset(caps.outcome_terms), process_terms=frozenset(caps.process_terms),
        initial_state=dict.fromkeys(caps.initial_state, (str, int, float, bool)),
    )


def fetch_info(spec: ServiceSpec, *, timeout_s: float | None = None) -> ServiceInfo:
    """``GET <url>/info``, parsed; ``ServiceContactError`` naming the URL otherwise."""
    url = f"{spec.url.rstrip('/')}/info"
    try:
        response = httpx.get(url, timeout=timeout_s or spec.timeout_s)
    except httpx.HTTPError as exc:
        raise ServiceContactError(
            f"environment service {url} is unreachable ({type(exc).__name__}: {exc}); is the"
            " service running, and is service.url its base URL?") from exc
    if response.status_code >= 400:
        raise ServiceContactError(
            f"environment service {url} answered {response.status_code}"
            f" ({response.text[:200]!r}); service.url must be the base URL of a service"
            f" speaking {PROTOCOL}")
    try:
        return ServiceInfo.model_validate(response.json())
    except (ValidationError, ValueError) as exc:
        raise ServiceContactError(
            f"environment service {url} did not answer {PROTOCOL}'s GET /info: "
            f"{str(exc)[:500]}") from exc


def info_mismatches(contract: EnvironmentContract, info: ServiceInfo) -> list[tuple[str, str]]:
    """(contract path, what is wrong) for each way the service is not the one pinned."""
    spec = contract.service
    if spec is None:
        raise ValueError(f"contract for {contract.task!r} names no service")
    wrong = []
    if info.protocol != PROTOCOL:
        wrong.append(("service.url", f"speaks {info.protocol!r}, not {PROTOCOL!r}"))
    if info.task != contract.task:
        wrong.append(("task", f"serves {info.task!r}, not {contract.task!r}"))
    if info.verifier_digest != spec.verifier_digest:
        wrong.append(("service.verifier_digest",
                      f"declares verifier {info.verifier_digest}, the contract pins "
                      f"{spec.verifier_digest}"))
    return wrong


def contact_problems(
    contract: EnvironmentContract, *, timeout_s: float = CONTACT_TIMEOUT_S
) -> list[ContractProblem]:
    """Every problem the contract's service shows when asked (none for a contract without)."""
    spec = contract.service
    if spec is None:
        return []
    try:
        info = fetch_info(spec, timeout_s=min(timeout_s, spec.timeout_s))
    except ServiceContactError as exc:
        return [ContractProblem("service.url", str(exc))]
    problems = [ContractProblem(path, f"environment service {spec.url} {message}")
                for path, message in info_mismatches(contract, info)]
    if problems:
        return problems
    found = capability_problems(
        contract.model_dump(mode="json"), {contract.task: served_capabilities(info)},
        frozenset(type(contract.success_criteria).model_fields), lambda _loc: None)
    return [ContractProblem(p.path, f"{p.message} (the service at {spec.url} declares it in"
                                    " GET /info)") for p in found]
