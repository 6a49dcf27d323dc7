"""The source files that implement an environment and its verifier, and their sha256.

An environment version's id covers code as well as the contract and fixtures, so a
change to reward logic makes a new version. The files are found without importing
anything (the kernel imports no loop): starting from ``execution_loop.environments.
<task>``, each module's source is parsed and followed through

- its imports of ``execution_loop`` modules (anywhere in the module, except under
  ``if TYPE_CHECKING:``, which never runs);
- string constants that name a function by reference (``"execution_loop.x.y:verify"``:
  verifiers are run by name in their own interpreter);
- string constants naming a ``.py`` file beside the module (``ci_guard.py``, whose
  source the verifier sends to the process it starts).

The verifier hash admission pins is the same walk started from the verifier module.
"""

from __future__ import annotations

import ast
import hashlib
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

ENVIRONMENTS_PACKAGE = "execution_loop.environments"
_OWN = "execution_loop"
_REFERENCE = re.compile(r"^(execution_loop(?:\.\w+)+):\w+$")


class EnvironmentCodeError(LookupError):
    """An environment or verifier module whose source cannot be found."""


def module_file(name: str, search: Sequence[str] | None = None) -> Path | None:
    """The source file of a module, found on ``sys.path`` without importing it."""
    rel = Path(*name.split("."))
    for entry in search if search is not None else sys.path:
        base = Path(entry or ".")
        for candidate in (base / rel.with_suffix(".py"), base / rel / "__init__.py"):
            if candidate.is_file():
                return candidate.resolve()
    return None


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _nodes(tree: ast.AST) -> Iterable[ast.AST]:
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                stack.extend(child.orelse)
            else:
                stack.append(child)


def _references(name: str, path: Path) -> tuple[set[str], set[Path]]:
    """Modules and sibling ``.py`` files a module's source names."""
    modules: set[str] = set()
    files: set[Path] = set()
    for node in _nodes(ast.parse(path.read_bytes())):
        if isinstance(node, ast.Import):
            modules.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.add(node.module)
            modules.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = _REFERENCE.match(node.value)
            if match:
                modules.add(match.group(1))
            elif re.fullmatch(r"\w+\.py", node.value) and (path.parent / node.value).is_file():
                files.add((path.parent / node.value).resolve())
    del name
    return {m for m in modules if m == _OWN or m.startswith(_OWN + ".")}, files


def code_hashes(roots: Sequence[str], search: Sequence[str] | None = None) -> dict[str, str]:
    """``module or file -> sha256`` of the roots and everything of ours they reach."""
    found: dict[str, str] = {}
    pending = list(roots)
    seen: set[str] = set()
    for root in roots:
        if module_file(root, search) is None:
            raise EnvironmentCodeError(f"module {root!r} has no source file on the path")
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        path = module_file(name, search)
        if path is None:
            continue  # `from package import function`: the package was added on its own
        found[name] = hashlib.sha256(path.read_bytes()).hexdigest()
        modules, files = _references(name, path)
        pending.extend(sorted(modules - seen))
        package = name.rpartition(".")[0]
        for file in sorted(files):
            found[f"{package}/{file.name}"] = hashlib.sha256(file.read_bytes()).hexdigest()
    return dict(sorted(found.items()))


def environment_code_hashes(task: str, search: Sequence[str] | None = None) -> dict[str, str]:
    """The code of the built-in environment ``task`` and of its verifier."""
    return code_hashes([f"{ENVIRONMENTS_PACKAGE}.{task}"], search)


def digest(hashes: dict[str, str]) -> str:
    """One sha256 for a set of file hashes (sorted ``name sha256`` lines)."""
    lines = "".join(f"{name} {sha}\n" for name, sha in sorted(hashes.items()))
    return hashlib.sha256(lines.encode()).hexdigest()


def verifier_hash(references: Sequence[str], search: Sequence[str] | None = None) -> str | None:
    """The pinned hash of the verifier(s) named by ``module:function`` references."""
    modules = sorted({r.partition(":")[0] for r in references})
    return digest(code_hashes(modules, search)) if modules else None


def environment_verifier_hash(task: str, search: Sequence[str] | None = None) -> str | None:
    """The verifier hash of a built-in environment, from its ``VERIFIER`` reference."""
    path = module_file(f"{ENVIRONMENTS_PACKAGE}.{task}", search)
    if path is None:
        raise EnvironmentCodeError(
            f"environment {task!r} has no module {ENVIRONMENTS_PACKAGE}.{task}"
        )
    for node in ast.parse(path.read_bytes()).body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "VERIFIER" for t in node.targets)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            return verifier_hash([node.value.value], search)
    return None
