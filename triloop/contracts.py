"""Environment contracts: the schema, validation that reports every problem, identity.

A contract is a YAML document (task, initial_state, observations, allowed_actions,
success_criteria, reward, limits, context, sandbox, fixtures, and optionally service).
Its identity is the sha256 of a canonical form: the parsed contract as sorted-key
compact JSON together with the sha256 of every fixture file, so key order, whitespace
and spelling variants such as ``0.50%`` never change it, while any fixture edit does.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PrivateAttr,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from triloop.contract_checks import (
    Capabilities,
    ContractProblem,
    capability_problems,
    fixture_problems,
    schema_problems,
    yaml_problems,
)
from triloop.environment_code import EnvironmentCodeError, environment_code_hashes

__all__ = [
    "AgentSpec",
    "Capabilities",
    "ContractError",
    "ContractProblem",
    "EnvironmentContract",
    "canonical_form",
    "contract_id",
    "fixture_hashes",
    "load_contract",
    "parse_contract_text",
    "parse_percentage",
    "validate_contract_text",
]

_PERCENT = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*%\s*$")
IGNORED_FIXTURE_PARTS = frozenset({"__pycache__", ".pytest_cache", ".mypy_cache"})


def parse_percentage(value: object) -> float | None:
    """Parse ``'0.5%'`` into the fraction 0.005 (``None`` stays ``None``)."""
    if value is None:
        return None
    match = _PERCENT.match(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"expected a percentage like '0.5%', got {value!r}")
    fraction = float(match.group(1)) / 100
    if fraction > 1.0:
        raise ValueError(f"expected a percentage between 0% and 100%, got {value!r}")
    return fraction


def format_percentage(value: float | None) -> str | None:
    """Write a fraction back as a percentage string (the form the YAML uses)."""
    return None if value is None else f"{round(value * 100, 10)!r}%"


def _fixture_path(value: str) -> str:
    path = PurePosixPath(value)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise ValueError(f"expected a path inside the contract's folder, got {value!r}")
    return path.as_posix()


Percentage = Annotated[
    float | None,
    BeforeValidator(parse_percentage),
    PlainSerializer(format_percentage, return_type=str | None),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": _PERCENT.pattern, "examples": ["0.5%"]},
                {"type": "null"},
            ]
        }
    ),
]
FixturePath = Annotated[str, AfterValidator(_fixture_path)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class SuccessCriteria(_Section):
    """What the verifier checks; a criterion left out (or false) is not required."""

    all_tests_pass: bool = False
    no_new_failures: bool = False  # a skipped test counts as a new failure
    coverage_drop_lt: Percentage = None  # fraction of line coverage, e.g. 0.005 for 0.5%
    goal_reached: bool = False
    exact_answer: bool = False

    @model_validator(mode="after")
    def _something_required(self) -> SuccessCriteria:
        if not self.required():
            raise ValueError("at least one success criterion must be required")
        return self

    def required(self) -> dict[str, Any]:
        """The criteria this contract actually requires, by name."""
        return {k: v for k, v in self.model_dump().items() if v not in (None, False)}


class RewardSpec(_Section):
    """Outcome reward terms (``success`` is required) and per-step process terms."""

    outcome: dict[str, float]
    process: dict[str, float] = Field(default_factory=dict)

    @field_validator("outcome")
    @classmethod
    def _names_success(cls, value: dict[str, float]) -> dict[str, float]:
        if "success" not in value:
            raise ValueError("must name the reward for 'success'")
        return value


class Limits(_Section):
    """Episode budget; the harness enforces tokens, the environment turns and time."""

    max_turns: int = Field(gt=0)
    wall_time_s: float = Field(gt=0)  # seconds for the whole episode
    max_tokens_per_turn: int = Field(gt=0)
    max_total_tokens: int = Field(gt=0)


class ContextRule(_Section):
    """How the harness renders history: keep the last K turns (0 keeps all)."""

    keep_last_turns: int = Field(default=0, ge=0)


class SandboxSpec(_Section):
    """Limits for each command the environment runs on the agent's behalf."""

    cpu_time_s: int = Field(default=5, gt=0)  # CPU seconds (RLIMIT_CPU)
    memory_mb: int = Field(default=512, gt=0)  # address space, MiB (RLIMIT_AS)
    wall_time_s: float = Field(default=10.0, gt=0)  # seconds before the group is killed
    max_output_bytes: int = Field(default=16384, gt=0)  # per stream, head and tail kept


# -- black-box agents (issue 17: the model gateway and the command harness) ----------------


class AgentSpec(_Section):
    """A black-box agent program that plays each episode instead of triloop's chat harness.

    The program runs in the sandbox, in a fresh work directory holding a copy of
    ``files``, with the task on stdin and its model base URL pointed at the gateway
    (``execution_loop.command_agent``).
    """

    harness: Literal["command"] = "command"
    command: list[str] = Field(min_length=1)  # argv; "{python}" is the worker's interpreter
    files: list[FixturePath] = Field(default_factory=list)  # fixtures copied into its work dir
    cpu_time_s: int = Field(default=120, gt=0)  # CPU seconds for the agent process (RLIMIT_CPU)
    memory_mb: int = Field(default=2048, gt=0)  # address space, MiB (RLIMIT_AS)
    max_output_bytes: int = Field(default=16384, gt=0)  # per stream kept in the record


class ServiceSpec(_Section):
    """An environment that runs as its own HTTP service (``docs/environment-service.md``).

    The service verifies episodes on its side; ``verifier_digest`` pins the verifier it
    declares in ``GET /info``, and triloop's verifier process refuses a verdict from a
    service declaring any other (so a redeployed verifier is a new contract version).
    """

    url: str = Field(pattern=r"^https?://[^\s/]+(/[^\s]*)?$")  # base URL of the service
    verifier_digest: str = Field(pattern=r"^[0-9a-f]{64}$")  # sha256 the service declares
    timeout_s: float = Field(default=30.0, gt=0)  # seconds per request


class ToolSpec(_Section):
    """A tool the agent may call, as a JSON-schema function (OpenAI's ``function`` shape)."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})

    @field_validator("parameters")
    @classmethod
    def _an_object_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        if value.get("type") != "object":
            raise ValueError("parameters must be a JSON schema with type: object")
        properties = value.get("properties", {})
        required = value.get("required", [])
        if not isinstance(properties, dict) or not isinstance(required, list):
            raise ValueError("properties must be a mapping and required a list")
        missing = [r for r in required if r not in properties]
        if missing:
            raise ValueError(f"required names no property: {', '.join(map(str, missing))}")
        return value


class NetworkSpec(_Section):
    """Named endpoints agent code may reach from its network-less sandbox (nothing else)."""

    endpoints: dict[str, str] = Field(default_factory=dict)  # name -> "host:port"

    @field_validator("endpoints")
    @classmethod
    def _named_host_ports(cls, value: dict[str, str]) -> dict[str, str]:
        for name, address in value.items():
            if not re.fullmatch(r"[a-z][a-z0-9_]{0,31}", name):
                raise ValueError(f"endpoint name {name!r}: lower-case letters, digits and _")
            if not re.fullmatch(r"\[?[A-Za-z0-9.:-]+\]?:\d{1,5}", address):
                raise ValueError(f"endpoint {name}: expected 'host:port', got {address!r}")
        return value


class IsolationSpec(_Section):
    """Whether agent code may run unisolated where bubblewrap cannot run (development only).

    Absent, agent code (a black-box agent, the code a policy writes) runs only in the
    bubblewrap sandbox: a worker where bubblewrap cannot run refuses the contract's tasks at
    admission and their episodes (``execution_loop.sandboxes.default_sandbox``).
    """

    # true: on such a worker the code runs with rlimits alone, and each episode's record
    # says so; bubblewrap is still used wherever it runs.
    allow_unisolated: bool = False


class HooksSpec(_Section):
    """Lifecycle hooks (``execution_loop.hooks``): ``module:function`` references."""

    before_reset: list[str] = Field(default_factory=list)
    after_step: list[str] = Field(default_factory=list)
    after_episode: list[str] = Field(default_factory=list)

    @field_validator("before_reset", "after_step", "after_episode")
    @classmethod
    def _references(cls, value: list[str]) -> list[str]:
        bad = [r for r in value if not re.fullmatch(r"\w+(\.\w+)*:\w+", r)]
        if bad:
            raise ValueError(f"expected 'module:function' references, got {', '.join(bad)}")
        return value

    def modules(self) -> list[str]:
        """Every module a hook lives in (their code is part of the version)."""
        refs = [*self.before_reset, *self.after_step, *self.after_episode]
        return sorted({r.partition(":")[0] for r in refs})


# Sections a contract may leave out. Unset, they are not part of the canonical form, so
# every contract written before a section existed keeps its identity.
OPTIONAL_SECTIONS = ("agent", "service", "tools", "hooks", "network", "isolation")


class EnvironmentContract(_Section):
    """An immutable environment contract as written in its YAML file."""

    task: str = Field(pattern=r"^[a-z][a-z0-9_]*$")  # the environment implementation
    version: str = "1"
    description: str = ""
    initial_state: dict[str, Any] = Field(default_factory=dict)  # scalar parameters
    observations: list[str] = Field(min_length=1)
    allowed_actions: list[str] = Field(min_length=1)
    success_criteria: SuccessCriteria
    reward: RewardSpec
    limits: Limits
    context: ContextRule = Field(default_factory=ContextRule)
    sandbox: SandboxSpec = Field(default_factory=SandboxSpec)
    fixtures: list[FixturePath] = Field(default_factory=list)  # relative to the file
    agent: AgentSpec | None = None  # a black-box agent program; None: triloop's chat harness
    service: ServiceSpec | None = None  # an environment served over HTTP; None: in-process
    tools: list[ToolSpec] | None = None  # functions the agent may call; None: plain text turns
    hooks: HooksSpec | None = None  # checks run before reset, after each step, after the episode
    network: NetworkSpec | None = None  # endpoints agent code may reach; None: no network
    isolation: IsolationSpec | None = None  # None: agent code runs only under bubblewrap

    _source_dir: Path | None = PrivateAttr(default=None)

    @field_validator("initial_state")
    @classmethod
    def _scalars_only(cls, value: dict[str, Any]) -> dict[str, Any]:
        bad = [k for k, v in value.items() if not isinstance(v, str | int | float | bool)]
        if bad:
            raise ValueError(f"values must be strings, numbers or booleans: {', '.join(bad)}")
        return value

    @field_validator("tools")
    @classmethod
    def _distinct_tools(cls, value: list[ToolSpec] | None) -> list[ToolSpec] | None:
        names = [t.name for t in value or []]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"duplicate tool names: {', '.join(twice)}")
        return value

    @field_validator("observations", "allowed_actions")
    @classmethod
    def _no_duplicates(cls, value: list[str]) -> list[str]:
        seen = {v for v in value if value.count(v) > 1}
        if seen:
            raise ValueError(f"duplicate entries: {', '.join(sorted(seen))}")
        return value

    @model_validator(mode="after")
    def _agent_files_are_fixtures(self) -> EnvironmentContract:
        if self.agent is not None:
            missing = [f for f in self.agent.files if not _is_listed(f, self.fixtures)]
            if missing:
                raise ValueError(
                    f"agent.files must be listed under fixtures: {', '.join(missing)}"
                )
        return self

    @property
    def allows_unisolated(self) -> bool:
        """Whether the contract says its agent code may run unisolated (``isolation``)."""
        return self.isolation is not None and self.isolation.allow_unisolated

    @property
    def source_dir(self) -> Path | None:
        """Folder of the file this contract was loaded from (fixtures resolve here)."""
        return self._source_dir

    def fixture_path(self, relative: str) -> Path:
        """Absolute path of one of this contract's fixtures."""
        if self._source_dir is None:
            raise ContractError([ContractProblem("fixtures", "contract has no source folder")])
        if _fixture_path(relative) not in self.fixtures:
            raise ContractError([ContractProblem("fixtures", f"{relative!r} is not listed")])
        return self._source_dir / relative


def _is_listed(path: str, fixtures: list[str]) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in fixtures)


class ContractError(Exception):
    """A contract that failed validation; carries every problem found."""

    def __init__(self, problems: list[ContractProblem], source: str | None = None) -> None:
        self.problems = problems
        head = f"contract {source}" if source else "contract"
        lines = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"{head} has {len(problems)} problem(s):\n{lines}")


def validate_contract_text(
    text: str,
    *,
    base_dir: Path,
    capabilities: Mapping[str, Capabilities] | None = None,
) -> list[ContractProblem]:
    """Every problem in a contract document (empty when it is valid).

    With ``capabilities`` (environment name -> what it supports) the contract is also
    checked against its environment: actions, observations, criteria, reward terms.
    """
    return _parse(text, base_dir=base_dir, capabilities=capabilities)[0]


def parse_contract_text(
    text: str,
    *,
    base_dir: Path,
    capabilities: Mapping[str, Capabilities] | None = None,
    source: str | None = None,
) -> EnvironmentContract:
    """Parse and validate a contract document or raise ``ContractError``."""
    problems, contract = _parse(text, base_dir=base_dir, capabilities=capabilities)
    if problems or contract is None:
        raise ContractError(problems, source=source)
    contract._source_dir = base_dir.resolve()
    return contract


def load_contract(
    path: Path | str, *, capabilities: Mapping[str, Capabilities] | None = None
) -> EnvironmentContract:
    """Load a contract file; fixtures resolve relative to its folder."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ContractError([ContractProblem("", f"cannot read {file}: {exc}")]) from exc
    return parse_contract_text(
        text, base_dir=file.parent, capabilities=capabilities, source=str(file)
    )


def fixture_hashes(contract: EnvironmentContract, base_dir: Path | None = None) -> dict[str, str]:
    """sha256 of every fixture file, keyed by its path relative to the contract."""
    base = base_dir or contract.source_dir
    if base is None:
        raise ValueError("contract was not loaded from a file: pass base_dir")
    hashes: dict[str, str] = {}
    for rel in contract.fixtures:
        root = base / rel
        files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        for file in files:
            inner = file.relative_to(root).parts if root.is_dir() else ()
            if IGNORED_FIXTURE_PARTS.intersection(inner) or file.suffix == ".pyc":
                continue  # caches appear when fixtures are run; they are not content
            key = PurePosixPath(rel, *inner).as_posix()
            hashes[key] = hashlib.sha256(file.read_bytes()).hexdigest()
    return hashes


def canonical_form(
    contract: EnvironmentContract,
    fixture_hashes: Mapping[str, str],
    code_hashes: Mapping[str, str] | None = None,
) -> bytes:
    """Sorted-key compact JSON of the contract, its fixture hashes and its code's hashes."""
    dumped = contract.model_dump(mode="json")
    for section in OPTIONAL_SECTIONS:
        if dumped.get(section) is None:
            dumped.pop(section, None)
    document = {
        "contract": dumped,
        "fixtures": dict(fixture_hashes),
        "code": dict(code_hashes or {}),
    }
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return text.encode("utf-8")


def contract_id(
    contract: EnvironmentContract,
    hashes: Mapping[str, str] | None = None,
    code: Mapping[str, str] | None = None,
) -> str:
    """sha256 hex of the canonical form: contract, fixtures and the environment's code.

    Fixtures and code are hashed from disk when not given; a task without an
    implementation module has no code to hash (registration refuses those). A served
    environment's code is triloop's client and verifier for the protocol.
    """
    if hashes is None:
        hashes = fixture_hashes(contract)
    if code is None:
        try:
            code = environment_code_hashes(
                contract.task, service=contract.service is not None,
                hooks=contract.hooks.modules() if contract.hooks else (),
            )
        except EnvironmentCodeError:
            code = {}
    return hashlib.sha256(canonical_form(contract, hashes, code)).hexdigest()


def _parse(
    text: str, *, base_dir: Path, capabilities: Mapping[str, Capabilities] | None
) -> tuple[list[ContractProblem], EnvironmentContract | None]:
    problems, data, locate = yaml_problems(text)
    if data is None:
        return problems, None
    contract: EnvironmentContract | None = None
    try:
        contract = EnvironmentContract.model_validate(data)
    except ValidationError as exc:
        problems.extend(schema_problems(exc, EnvironmentContract, locate))
    problems.extend(fixture_problems(data, base_dir, _fixture_path, locate))
    if capabilities is not None and data.get("service") is None:
        # A served environment states its capabilities in GET /info: checked when opened.
        criteria = frozenset(SuccessCriteria.model_fields)
        problems.extend(capability_problems(data, capabilities, criteria, locate))
    problems.sort(key=lambda p: p.line or 0)  # document order; stable within a line
    return problems, (contract if not problems else None)
