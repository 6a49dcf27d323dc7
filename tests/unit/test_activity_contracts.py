"""Every activity a loop implements is declared once in its contracts module, and back.

A workflow calls an activity through its ``ActivityContract`` and the worker registers
the implementation under ``CONTRACT.name``; a name declared but never implemented (or
implemented but never declared) would only fail at run time, when a workflow schedules it.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from datetime import timedelta
from pathlib import Path
from types import ModuleType

import pytest
from temporalio import activity
from temporalio.common import RetryPolicy

from triloop.activity_contract import ActivityContract

ROOT = Path(__file__).resolve().parents[2]
LOOPS = {"learning_loop": "learning_loop.activities",
         "execution_loop": "execution_loop",
         "governance_loop": "governance_loop.activities"}


def declared(contracts: ModuleType) -> dict[str, ActivityContract[object, object]]:
    return {c.name: c for c in vars(contracts).values() if isinstance(c, ActivityContract)}


def implemented(package: str) -> dict[str, object]:
    found: dict[str, object] = {}
    root = importlib.import_module(package)
    modules = [root] + [importlib.import_module(f"{package}.{info.name}")
                        for info in pkgutil.iter_modules(root.__path__)]
    for module in modules:
        for _, cls in inspect.getmembers(module, inspect.isclass):
            for _, method in inspect.getmembers(cls, inspect.isfunction):
                definition = activity._Definition.from_callable(method)
                if definition is not None and definition.name:
                    found[definition.name] = method
    return found


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_each_contract_has_one_implementation_and_back(loop: str) -> None:
    contracts = importlib.import_module(f"{loop}.contracts")
    assert set(declared(contracts)) == set(implemented(LOOPS[loop]))


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_workflows_call_activities_only_through_contracts(loop: str) -> None:
    bare = []
    for path in sorted((ROOT / loop).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id == "workflow"
                    and node.attr in ("execute_activity", "start_activity")):
                bare.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert bare == []


def test_a_contract_refuses_a_name_outside_the_scheme() -> None:
    with pytest.raises(ValueError, match="<loop>.<verb>_<noun>"):
        ActivityContract("run_episode_activity", int, int, timedelta(seconds=1), RetryPolicy())


def test_a_contract_refuses_the_wrong_message() -> None:
    contract = ActivityContract("learning.echo", int, int, timedelta(seconds=1), RetryPolicy())
    with pytest.raises(TypeError, match="learning.echo takes int, got str"):
        contract._check("7")  # type: ignore[arg-type]
