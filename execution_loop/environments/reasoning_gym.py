"""reasoning-gym's procedural datasets as tasks, judged by each dataset's own ``score_answer``.

A task's ``item`` is one dataset entry made JSON-safe: ``{"dataset", "config",
"question", "answer", "metadata"}``; the seed only numbers the task. One turn: the
observation is the question and an instruction to reply ``answer: <answer>``; the action is
the model's answer. The verifier, in its own process, rebuilds the dataset from the item's
name and config and calls its ``score_answer(answer, entry)``, reasoning-gym's own scorer.
A score of 1.0 is a success; a lower score pays ``partial_credit`` times the score, which
the shipped contract sets to 0.0 (reasoning-gym's default scorer gives credit for any
answer that contains the right one, which a model can game by listing candidates).

``generate({"dataset", "count", "seed", "config"})`` is a task set's generator: entry ``i``
of ``create_dataset(dataset, seed=seed, size=count, **config)`` is task ``i``.
``describe`` gives a task's content (question, answer, dataset, config) and its tags: the
domain (the dataset module's category, e.g. ``arithmetic``), the capability (the dataset's
name) and the difficulty (the config's ``difficulty``, else the ranges the config sets,
which reasoning-gym records in each entry's ``metadata["difficulty"]``).

reasoning-gym is imported only where it is needed (describe, generate and the verifier):
it takes seconds, and the registry imports this module in every process. The verifier's
interpreter may import it because ``VERIFIER_DISTRIBUTIONS`` names it, so its files count
in the verifier hash and the version id.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import re
import sys
import types
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from execution_loop.environments.base import (
    EnvironmentStateError,
    GeneratedTask,
    Outcome,
    StepResult,
    TaskCapabilities,
    TaskContent,
    fingerprint,
)
from execution_loop.verification import VerifierRequest, run_verifier

if TYPE_CHECKING:
    from execution_loop.sandbox import SandboxBackend
    from triloop.contracts import EnvironmentContract

TASK = "reasoning_gym"
VERIFIER = "execution_loop.environments.reasoning_gym:verify"
VERIFIER_DISTRIBUTIONS = ("reasoning-gym",)
INSTRUCTIONS = "Reply with 'answer: <your answer>' and nothing else."
CAPABILITIES = TaskCapabilities(
    actions=frozenset({"answer"}),
    observations=frozenset({"question"}),
    success_criteria=frozenset({"exact_answer"}),
    outcome_terms=frozenset({"success", "failure", "partial_credit"}),
    process_terms=frozenset({"valid_action", "invalid_action"}),
)
ITEM_KEYS = ("dataset", "config", "question", "answer", "metadata")
ITEM_OPTIONAL_KEYS = ("source",)  # {"seed", "index", "module"}: how the entry was made
GENERATOR_PARAMS = frozenset({"dataset", "count", "seed", "config"})
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_RESERVED_CONFIG = frozenset({"seed", "size"})  # the generator's own parameters
SUCCESS_SCORE = 1.0


def json_safe(value: Any) -> Any:
    """A value as JSON can hold it: tuples and sets as lists, numbers as numbers, the rest
    as text (metadata may hold numpy scalars, fractions or sympy objects)."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((json_safe(v) for v in value), key=repr)
    item = getattr(value, "item", None)  # a numpy scalar
    if callable(item):
        try:
            return json_safe(item())
        except (TypeError, ValueError):
            pass
    return str(value)


def make_item(
    dataset: str,
    config: Mapping[str, Any],
    entry: Mapping[str, Any],
    source: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A task item from one reasoning-gym entry; ``source`` (``{"seed", "index",
    "module"}``) says how the generator made it, so the verifier can make it again, and
    importing only the dataset's module."""
    answer = entry.get("answer")
    item = {
        "dataset": dataset,
        "config": json_safe(dict(config)),
        "question": str(entry["question"]),
        "answer": None if answer is None else str(answer),
        "metadata": json_safe(dict(entry.get("metadata") or {})),
    }
    if source is not None:
        item["source"] = {"seed": int(source["seed"]), "index": int(source["index"]),
                          "module": str(source["module"])}
    return item


def check_item(item: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The item, or a ValueError naming what is missing (the item is the task here)."""
    if item is None:
        raise ValueError(
            "reasoning_gym needs a task item (a reasoning-gym dataset entry: dataset, "
            "config, question, answer, metadata); a seed alone makes no task"
        )
    if not isinstance(item, Mapping):
        raise ValueError(f"reasoning_gym's item must be an object, got {type(item).__name__}")
    missing = [key for key in ITEM_KEYS if key not in item]
    if missing:
        raise ValueError(f"reasoning_gym's item lacks {', '.join(missing)}")
    if not isinstance(item["dataset"], str) or not item["dataset"]:
        raise ValueError("reasoning_gym's item needs a dataset name")
    if not isinstance(item["question"], str) or not item["question"].strip():
        raise ValueError("reasoning_gym's item needs a question")
    for key in ("config", "metadata"):
        if not isinstance(item[key], Mapping):
            raise ValueError(f"reasoning_gym's item: {key} must be an object")
    if item["answer"] is not None and not isinstance(item["answer"], str):
        raise ValueError("reasoning_gym's item: answer must be text or null")
    source = item.get("source")
    if source is not None and not (
        isinstance(source, Mapping)
        and all(isinstance(source.get(k), int) and source[k] >= 0 for k in ("seed", "index"))
        and isinstance(source.get("module"), str)
        and str(source["module"]).startswith("reasoning_gym.")
    ):
        raise ValueError("reasoning_gym's item: source must be {seed, index, module}: "
                         "non-negative integers and a reasoning_gym module")
    return item


def parse_answer(text: str) -> str | None:
    """``answer: X`` (or ``<answer>X</answer>``) -> ``X``; None when the reply has neither."""
    stripped = text.strip()
    if stripped[:7].lower() == "answer:":
        return stripped[7:].strip()
    tagged = _ANSWER_TAG.search(stripped)
    return tagged.group(1).strip() if tagged else None


class ReasoningGym:
    """One reasoning-gym entry as a one-turn episode, bound to a contract."""

    def __init__(
        self, contract: EnvironmentContract, *, sandbox: SandboxBackend | None = None
    ) -> None:
        self.contract = contract
        self._sandbox = sandbox  # where the verifier runs (None: a local process)
        self._item: Mapping[str, Any] | None = None
        self._seed = 0
        self._turn = 0
        self._done = False
        self._answer: str | None = None
        self._observation = ""

    def reset(self, seed: int, item: Mapping[str, Any] | None = None) -> str:
        """Start an episode on the item's question (the item is required)."""
        self._item = dict(check_item(item))
        self._seed, self._turn, self._done, self._answer = seed, 0, False, None
        self._observation = f"{self._item['question']}\n\n{INSTRUCTIONS}"
        return self._observation

    def step(self, action: str) -> StepResult:
        """Take the model's answer; the episode ends after this one turn."""
        if self._item is None:
            raise EnvironmentStateError("call reset(seed, item) first")
        if self._done:
            raise EnvironmentStateError("the episode is over; call reset(seed, item) again")
        self._turn += 1
        terms = self.contract.reward.process
        answer = parse_answer(action) if "answer" in self.contract.allowed_actions else None
        valid = answer is not None
        self._answer, self._done = answer, True
        reward = terms.get("valid_action" if valid else "invalid_action", 0.0)
        observation = f"answer recorded: {answer}" if valid else f"no answer found. {INSTRUCTIONS}"
        feedback: dict[str, Any] = {
            "valid_action": valid, "action": "answer" if valid else None,
            "ended_by": "answer", "failure": None, "truncated": None,
        }
        self._observation = observation
        return StepResult(observation, reward, True, feedback)

    def verifier_request(self) -> VerifierRequest:
        """The item (what the task is) and the answer text; nothing else of the episode."""
        if self._item is None:
            raise EnvironmentStateError("call reset(seed, item) first")
        keys = [*ITEM_KEYS, *(k for k in ITEM_OPTIONAL_KEYS if k in self._item)]
        payload = {
            "item": {key: self._item[key] for key in keys},
            "answer": self._answer,
            "reward": dict(self.contract.reward.outcome),
        }
        return VerifierRequest(VERIFIER, payload)

    def outcome(self) -> Outcome:
        """The dataset's own ``score_answer``, run in the verifier's process."""
        return run_verifier(self.verifier_request(), sandbox=self._sandbox)

    def state_fingerprint(self) -> str:
        """sha256 of the last observation, the turn and whether the episode is over."""
        if self._item is None:
            raise EnvironmentStateError("call reset(seed, item) first")
        return fingerprint({"observation": self._observation, "turn": self._turn,
                            "done": self._done})

    def close(self) -> None:
        """Nothing to release."""
        self._item = None


def _factory(module: str | None = None) -> Any:
    """reasoning-gym's dataset registry (``reasoning_gym.factory``).

    With the dataset's ``module`` (generated items record it), only that module is
    imported: its packages are entered without running their ``__init__``, which would
    import all hundred-odd datasets and matplotlib (25 s rather than 0.8 s for a verifier
    on a loaded machine). Anything that goes wrong falls back to the whole package."""
    factory = sys.modules.get("reasoning_gym.factory")
    if module and module.startswith("reasoning_gym.") and (
        factory is None or not hasattr(sys.modules.get("reasoning_gym"), "create_dataset")
    ):
        try:
            return _lean_factory(module)
        except Exception:  # a module that needs its package's __init__: import it all
            _forget_lean_imports()
    if not hasattr(sys.modules.get("reasoning_gym", _NOT_IMPORTED), "create_dataset"):
        _forget_lean_imports()  # entered lean before: now the whole package is needed
    import reasoning_gym  # seconds to import; only where a dataset is needed

    return reasoning_gym.factory


_NOT_IMPORTED = types.SimpleNamespace(create_dataset=None)  # "not imported at all"


def _forget_lean_imports() -> None:
    for name in [m for m in sys.modules if m.split(".")[0] == "reasoning_gym"]:
        del sys.modules[name]


def _lean_factory(module: str) -> Any:
    parts = module.split(".")
    spec = importlib.util.find_spec("reasoning_gym") if "reasoning_gym" not in sys.modules \
        else None
    for depth in range(1, len(parts)):
        package = ".".join(parts[:depth])
        if package in sys.modules:
            continue
        if spec is None or not spec.submodule_search_locations:
            raise ImportError(f"cannot find {package}")
        base = Path(next(iter(spec.submodule_search_locations)), *parts[1:depth])
        stub = types.ModuleType(package)
        stub.__path__ = [str(base)]
        stub.__package__ = package
        sys.modules[package] = stub
    importlib.import_module(module)
    return importlib.import_module("reasoning_gym.factory")


def _dataset(
    name: str,
    config: Mapping[str, Any],
    *,
    seed: int = 0,
    size: int = 1,
    module: str | None = None,
) -> Any:
    factory = _factory(module)
    if name not in factory.DATASETS:
        raise ValueError(f"reasoning-gym has no dataset {name!r}")
    reserved = sorted(_RESERVED_CONFIG & set(config))
    if reserved:
        raise ValueError(f"reasoning_gym: config may not set {', '.join(reserved)} "
                         "(the generator's own seed and count)")
    try:
        return factory.create_dataset(name, seed=seed, size=size, **config)
    except (TypeError, ValueError, AssertionError) as exc:
        raise ValueError(f"reasoning_gym: dataset {name!r} refuses config "
                         f"{dict(config)!r}: {exc}") from exc


def _entry(item: Mapping[str, Any]) -> tuple[Any, dict[str, Any], bool]:
    """The dataset and the entry to score against. A generated item is made again from its
    seed and index, so the scorer sees reasoning-gym's own metadata (tuples stay tuples:
    arc_agi compares grids as tuples) rather than its JSON form; the remade entry must
    have the item's question and answer, or the item's own form is used."""
    name, config = str(item["dataset"]), dict(item["config"])
    stored = {"question": item["question"], "answer": item["answer"],
              "metadata": dict(item["metadata"])}
    source = item.get("source")
    if isinstance(source, Mapping):
        index = int(source["index"])
        dataset = _dataset(name, config, seed=int(source["seed"]), size=index + 1,
                           module=str(source["module"]))
        remade = dataset[index]
        answer = remade.get("answer")
        if str(remade["question"]) == item["question"] and (
            None if answer is None else str(answer)
        ) == item["answer"]:
            return dataset, dict(remade), True
        return dataset, stored, False
    return _dataset(name, config), stored, False


def verify(payload: dict[str, Any]) -> Outcome:
    """Score the answer with the item's dataset's ``score_answer``."""
    item = check_item(payload["item"])
    terms: dict[str, float] = payload["reward"]
    given = payload.get("answer")
    remade = False
    if given is None:
        score, reason = 0.0, "no_answer"
    else:
        dataset, entry, remade = _entry(item)
        try:
            score = float(dataset.score_answer(str(given), entry))
        except Exception:  # a scorer that chokes on a malformed answer: the answer is wrong
            score, reason = 0.0, "unscorable_answer"
        else:
            reason = "correct" if score >= SUCCESS_SCORE else "wrong_answer"
    score = min(max(score, 0.0), 1.0) if math.isfinite(score) else 0.0
    success = score >= SUCCESS_SCORE
    if success:
        reward = terms["success"]
    else:
        reward = terms.get("failure", 0.0) + terms.get("partial_credit", 0.0) * score
    details = {"reason": reason, "score": score, "given": given, "dataset": item["dataset"],
               "remade": remade}
    return Outcome(success=success, reward=float(reward), details=details)


def reference_solution(
    seed: int, contract: EnvironmentContract, item: Mapping[str, Any] | None = None
) -> list[str]:
    """Play the item's own answer."""
    del seed, contract
    answer = check_item(item)["answer"]
    if answer is None:
        raise ValueError("reasoning_gym: this item has no answer to play as a reference")
    return [f"answer: {answer}"]


def _difficulty(config: Mapping[str, Any], metadata: Mapping[str, Any]) -> str | None:
    """The config's ``difficulty``, else the ranges it sets (``metadata["difficulty"]``)."""
    if config.get("difficulty") is not None:
        return _tag_text(config["difficulty"])
    ranges = metadata.get("difficulty")
    if isinstance(ranges, Mapping) and set(ranges) == {"difficulty"}:
        return _tag_text(ranges["difficulty"])  # a config whose one knob is its difficulty
    if isinstance(ranges, Mapping) and ranges:
        return ",".join(f"{key}={_tag_text(ranges[key])}" for key in sorted(ranges))
    if ranges is not None and not isinstance(ranges, Mapping):
        return _tag_text(ranges)
    return None


def _tag_text(value: Any) -> str:
    if isinstance(value, list | tuple) and len(value) == 2:
        return f"{_tag_text(value[0])}-{_tag_text(value[1])}"
    if isinstance(value, list | tuple):
        return "/".join(_tag_text(v) for v in value)
    return str(value)


def domain_of(dataset: str) -> str:
    """The dataset module's category (``reasoning_gym.<category>.<module>``)."""
    entry = _factory().DATASETS.get(dataset)
    if entry is None:
        raise ValueError(f"reasoning-gym has no dataset {dataset!r}")
    parts = entry[0].__module__.split(".")
    return parts[1] if len(parts) > 2 else "other"


def tags_of(item: Mapping[str, Any]) -> dict[str, str]:
    """Domain, capability and (where the config has one) difficulty."""
    dataset = str(item["dataset"])
    tags = {"domain": domain_of(dataset), "capability": dataset}
    difficulty = _difficulty(item["config"], item["metadata"])
    if difficulty is not None:
        tags["difficulty"] = difficulty
    return tags


def describe(
    seed: int, item: Mapping[str, Any] | None, contract: EnvironmentContract
) -> TaskContent:
    """A task is its question, answer, dataset and config (not its seed or metadata)."""
    del seed, contract
    checked = check_item(item)
    content = {
        "environment": TASK,
        "dataset": checked["dataset"],
        "config": json_safe(dict(checked["config"])),
        "question": checked["question"],
        "answer": checked["answer"],
    }
    return TaskContent(content, tags_of(checked))


def generate(params: Mapping[str, Any], contract: EnvironmentContract) -> Iterator[GeneratedTask]:
    """Entry ``i`` of the seeded dataset is task ``i``: the same params, the same tasks."""
    del contract
    unknown = sorted(set(params) - GENERATOR_PARAMS)
    if unknown:
        raise ValueError(f"reasoning_gym generator: unknown parameter(s) {', '.join(unknown)} "
                         f"(takes {', '.join(sorted(GENERATOR_PARAMS))})")
    dataset = params.get("dataset")
    if not isinstance(dataset, str) or not dataset:
        raise ValueError("reasoning_gym generator needs 'dataset', a reasoning-gym dataset name")
    count, seed = params.get("count"), params.get("seed", 0)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError(f"reasoning_gym generator: count must be a positive integer, "
                         f"got {count!r}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"reasoning_gym generator: seed must be an integer, got {seed!r}")
    config = params.get("config") or {}
    if not isinstance(config, Mapping):
        raise ValueError("reasoning_gym generator: config must be an object")
    source = _dataset(dataset, config, seed=seed, size=count)
    domain, module = domain_of(dataset), type(source).__module__
    for index in range(count):
        made = {"seed": seed, "index": index, "module": module}
        item = make_item(dataset, config, source[index], made)
        tags = {"domain": domain, "capability": dataset}
        difficulty = _difficulty(item["config"], item["metadata"])
        if difficulty is not None:
            tags["difficulty"] = difficulty
        yield GeneratedTask(seed=index, item=item, tags=tags)
