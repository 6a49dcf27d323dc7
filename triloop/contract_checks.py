"""Contract checks that the schema alone cannot make.

YAML syntax (with line numbers; aliases refused), duplicate keys (which PyYAML silently
resolves to the last one), locating any problem's line, and checking a contract against what its
environment implementation supports. Used by ``triloop.contracts``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

import yaml
from pydantic import BaseModel, ValidationError

from triloop import safe_yaml

Locate = Callable[[tuple[Any, ...]], int | None]


class Capabilities(Protocol):
    """What an environment implementation supports (``environments.base.TaskCapabilities``).

    Structural, so this module and ``triloop.contracts`` import nothing else from
    the execution loop and can move to the shared kernel together if governance needs them.
    """

    @property
    def actions(self) -> frozenset[str]: ...
    @property
    def observations(self) -> frozenset[str]: ...
    @property
    def success_criteria(self) -> frozenset[str]: ...
    @property
    def outcome_terms(self) -> frozenset[str]: ...
    @property
    def process_terms(self) -> frozenset[str]: ...
    @property
    def initial_state(self) -> Mapping[str, tuple[type, ...]]: ...
    @property
    def required_state(self) -> frozenset[str]: ...


@dataclass(frozen=True)
class ContractProblem:
    """One problem found in a contract document, located by a dotted path."""

    path: str
    message: str
    line: int | None = None  # 1-based line in the YAML, when known

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line is not None else ""
        return f"{where}{self.path or '<document>'}: {self.message}"


def dotted(loc: tuple[Any, ...]) -> str:
    """``('limits', 'max_turns')`` -> ``limits.max_turns``; list indices as ``[i]``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _no_line(_loc: tuple[Any, ...]) -> int | None:
    return None


def yaml_problems(text: str) -> tuple[list[ContractProblem], dict[str, Any] | None, Locate]:
    """Parse YAML: problems so far, the top-level mapping (None if unusable), a locator."""
    try:
        root, data = safe_yaml.compose_and_load(text)  # aliases refused: no "billion laughs"
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        detail = " ".join(str(p) for p in (exc.context, exc.problem) if p)
        column = f", column {mark.column + 1}" if mark else ""
        line = mark.line + 1 if mark else None
        refused = isinstance(exc, safe_yaml.YamlAliasRefused)
        kind = "YAML refused" if refused else "YAML syntax error"
        return [ContractProblem("", f"{kind}{column}: {detail}", line)], None, _no_line
    except safe_yaml.YamlTooDeep as exc:
        return [ContractProblem("", f"YAML refused: {exc}")], None, _no_line
    except yaml.YAMLError as exc:
        return [ContractProblem("", f"YAML syntax error: {exc}")], None, _no_line
    if root is None:
        return [ContractProblem("", "the document is empty; expected a mapping")], None, _no_line
    if not isinstance(root, yaml.MappingNode) or not isinstance(data, dict):
        line = root.start_mark.line + 1
        message = f"expected a mapping at the top level, got {type(data).__name__}"
        return [ContractProblem("", message, line)], None, _no_line
    return list(_duplicate_keys(root, ())), data, _locator(root)


def _child(node: yaml.Node, part: object) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                return value  # type: ignore[no-any-return]
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
        return node.value[part]  # type: ignore[no-any-return]
    return None


def _locator(root: yaml.Node) -> Locate:
    def locate(loc: tuple[Any, ...]) -> int | None:
        node = root
        for part in loc:
            child = _child(node, part)
            if child is None:
                break
            node = child
        return int(node.start_mark.line) + 1

    return locate


def _duplicate_keys(node: yaml.Node, path: tuple[Any, ...]) -> Iterator[ContractProblem]:
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            name = str(key.value)
            if name in seen:
                message = "duplicate key (YAML would silently keep only the last one)"
                yield ContractProblem(dotted((*path, name)), message, key.start_mark.line + 1)
            seen.add(name)
            yield from _duplicate_keys(value, (*path, name))
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            yield from _duplicate_keys(item, (*path, index))


def capability_problems(
    data: Mapping[str, Any],
    capabilities: Mapping[str, Capabilities],
    criteria_names: frozenset[str],
    locate: Locate,
) -> list[ContractProblem]:
    """Problems with a (raw) contract against what its environment supports."""
    task = data.get("task")
    if not isinstance(task, str):
        return []
    caps = capabilities.get(task)
    if caps is None:
        known = ", ".join(sorted(capabilities))
        return [
            ContractProblem(
                "task", f"unknown environment {task!r} (known: {known})", locate(("task",))
            )
        ]
    problems: list[ContractProblem] = []

    def report(loc: tuple[Any, ...], message: str) -> None:
        problems.append(ContractProblem(dotted(loc), message, locate(loc)))

    def check_names(
        loc: tuple[Any, ...], names: object, allowed: frozenset[str], noun: str
    ) -> None:
        items: list[tuple[Any, Any]] = list(enumerate(names)) if isinstance(names, list) else []
        if isinstance(names, dict):
            items = [(k, k) for k, v in names.items() if v is not False and v is not None]
        supported = ", ".join(sorted(allowed)) or "none"
        for key, name in items:
            if isinstance(name, str) and name not in allowed:
                report((*loc, key), f"{task} has no {noun} {name!r} (supported: {supported})")

    check_names(("allowed_actions",), data.get("allowed_actions"), caps.actions, "action")
    check_names(("observations",), data.get("observations"), caps.observations, "observation")
    criteria = data.get("success_criteria")
    if isinstance(criteria, dict):
        named = {k: v for k, v in criteria.items() if k in criteria_names}
        check_names(("success_criteria",), named, caps.success_criteria, "success criterion")
    reward = data.get("reward")
    if isinstance(reward, dict):
        check_names(
            ("reward", "outcome"), reward.get("outcome"), caps.outcome_terms, "outcome reward term"
        )
        check_names(
            ("reward", "process"), reward.get("process"), caps.process_terms, "process reward term"
        )
    state = data.get("initial_state", {})
    if isinstance(state, dict):
        for key in sorted(caps.required_state - set(state)):
            report(("initial_state",), f"{task} needs initial_state.{key}")
        for key, value in state.items():
            types = caps.initial_state.get(key)
            if types is None:
                supported = ", ".join(sorted(caps.initial_state)) or "none"
                report(
                    ("initial_state", key),
                    f"{task} has no parameter {key!r} (supported: {supported})",
                )
            elif not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
                wanted = " or ".join(t.__name__ for t in types)
                report(("initial_state", key), f"expected {wanted}, got {value!r}")
    return problems


_EXPECTED = {
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}


def schema_problems(
    exc: ValidationError, model: type[BaseModel], locate: Locate
) -> list[ContractProblem]:
    """Turn pydantic's errors into problems a contract author can act on."""
    problems = []
    for error in exc.errors():
        loc = tuple(error["loc"])
        kind = error["type"]
        if kind == "missing":
            message = "required field is missing"
        elif kind == "extra_forbidden":
            allowed = _allowed_keys(model, loc[:-1])
            message = "unknown key" + (f" (expected one of: {allowed})" if allowed else "")
        elif kind in _EXPECTED:
            message = f"expected {_EXPECTED[kind]}, got {_describe(error['input'])}"
        elif kind == "value_error":
            message = str(error["msg"]).removeprefix("Value error, ")
        else:  # e.g. greater_than: "input should be greater than 0, got -1"
            text = str(error["msg"])
            message = f"{text[:1].lower()}{text[1:]}, got {_describe(error['input'])}"
        problems.append(ContractProblem(dotted(loc), message, locate(loc)))
    return problems


def _allowed_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> str:
    for part in loc:
        field = model.model_fields.get(str(part))
        annotation = field.annotation if field else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return ""
        model = annotation
    return ", ".join(model.model_fields)


def _describe(value: object) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def fixture_problems(
    data: Mapping[str, Any],
    base_dir: Path,
    normalise: Callable[[str], str],
    locate: Locate,
) -> list[ContractProblem]:
    """Fixtures must exist as real files and folders inside the contract's folder.

    A listed fixture that is missing, is or passes through a symbolic link, holds one,
    or resolves outside ``base_dir`` is a problem; so is an ``initial_state`` value
    naming a fixture (``*_fixture``) that leaves the folder or is not listed. Without
    these checks such a contract was only refused at run time, or not at all.
    """
    problems: list[ContractProblem] = []
    root = base_dir.resolve()
    listed: list[str] = []
    fixtures = data.get("fixtures")
    for index, rel in enumerate(fixtures if isinstance(fixtures, list) else []):
        if not isinstance(rel, str):
            continue
        try:
            normal = normalise(rel)
        except ValueError:
            continue  # already reported by the schema
        listed.append(normal)
        message = _fixture_on_disk(base_dir, root, rel, normal)
        if message is not None:
            loc = ("fixtures", index)
            problems.append(ContractProblem(dotted(loc), message, locate(loc)))
    state = data.get("initial_state")
    for key, value in (state.items() if isinstance(state, Mapping) else ()):
        if not (isinstance(key, str) and key.endswith("_fixture") and isinstance(value, str)):
            continue
        where: tuple[str, str] = ("initial_state", key)
        try:
            normal = normalise(value)
        except ValueError:
            message = (f"{value!r} leaves the contract's folder; name one of the fixtures "
                       "listed under fixtures")
            problems.append(ContractProblem(dotted(where), message, locate(where)))
            continue
        if not any(normal == f or normal.startswith(f + "/") for f in listed):
            message = f"{value!r} is not one of the fixtures listed under fixtures"
            problems.append(ContractProblem(dotted(where), message, locate(where)))
    return problems


def _fixture_on_disk(base_dir: Path, root: Path, rel: str, normal: str) -> str | None:
    path = base_dir
    for part in PurePosixPath(normal).parts:
        path = path / part
        if path.is_symlink():
            return (f"fixture {rel} is or passes through a symbolic link ({path} -> "
                    f"{os.readlink(path)}); fixtures must be real files and folders inside the "
                    "contract's folder")
    if not path.exists():
        return f"fixture not found: {rel} (looked in {root})"
    if not path.resolve().is_relative_to(root):
        return f"fixture {rel} resolves to {path.resolve()}, outside the contract's folder {root}"
    if path.is_dir():
        for folder, dirs, files in os.walk(path, followlinks=False):
            for name in sorted(dirs + files):
                inner = Path(folder, name)
                if inner.is_symlink():
                    return (f"fixture {rel} holds a symbolic link, {inner.relative_to(base_dir)}"
                            f" -> {os.readlink(inner)}; replace it with the real file")
                if name in files and not inner.is_file():
                    return (f"fixture {rel} holds {inner.relative_to(base_dir)}, which is not a "
                            "regular file")
    elif not path.is_file():
        return f"fixture {rel} is not a regular file or folder"
    return None
