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

An environment from outside triloop (a package declaring an entry point in the
``triloop.environments`` group, ``name = "package.module:Class"``) is walked the same
way from its module, following its own top-level package as well as ours; the entry
point is read from the installed distribution's metadata, never imported here.
"""

from __future__ import annotations

import ast
import hashlib
import re
import sys
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path

ENVIRONMENTS_PACKAGE = "execution_loop.environments"
PLUGIN_GROUP = "triloop.environments"  # entry points: name = "package.module:Class"
SERVICE_MODULE = f"{ENVIRONMENTS_PACKAGE}.service"  # the client of a served environment
_OWN = "execution_loop"
PROTOCOL_MODULE = "triloop_environment_protocol"  # the environment service's models
_REFERENCE = re.compile(r"^(\w+(?:\.\w+)+):\w+$")


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


def plugin_entry_point(task: str) -> metadata.EntryPoint | None:
    """The installed ``triloop.environments`` entry point named ``task`` (not imported)."""
    for entry in metadata.entry_points(group=PLUGIN_GROUP):
        if entry.name == task:
            return entry
    return None


def plugin_search_path(module: str) -> list[str]:
    """Folders an out-of-tree module needs on the path: where its distribution lives."""
    top = module.split(".")[0]
    for entry in metadata.entry_points(group=PLUGIN_GROUP):
        if entry.module.split(".")[0] == top and entry.dist is not None:
            return [str(Path(str(entry.dist.locate_file(""))).resolve())]
    return []


def environment_module(
    task: str, search: Sequence[str] | None = None, *, service: bool = False
) -> str:
    """The module implementing ``task``: a built-in one, else an installed plugin's.

    A served environment (``service`` in its contract) runs behind triloop's HTTP client.
    """
    if service:
        return SERVICE_MODULE
    builtin = f"{ENVIRONMENTS_PACKAGE}.{task}"
    if module_file(builtin, search) is not None:
        return builtin
    entry = plugin_entry_point(task)
    if entry is None:
        raise EnvironmentCodeError(
            f"environment {task!r} has no module {builtin} and no installed "
            f"{PLUGIN_GROUP!r} entry point"
        )
    return entry.module


def _own_packages(roots: Iterable[str]) -> frozenset[str]:
    """Packages whose modules a walk follows: ours and each root's top-level package."""
    # The protocol's standalone models are the served client's code too (a change to them is
    # a new version of every served environment), though they live outside execution_loop.
    return frozenset({_OWN, PROTOCOL_MODULE, *(r.split(".")[0] for r in roots)})


def _is_own(module: str, own: frozenset[str]) -> bool:
    return module.split(".")[0] in own


def _references(name: str, path: Path, own: frozenset[str]) -> tuple[set[str], set[Path]]:
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
            if match and _is_own(match.group(1), own):
                modules.add(match.group(1))
            elif re.fullmatch(r"\w+\.py", node.value) and (path.parent / node.value).is_file():
                files.add((path.parent / node.value).resolve())
    del name
    return {m for m in modules if _is_own(m, own)}, files


def code_hashes(roots: Sequence[str], search: Sequence[str] | None = None) -> dict[str, str]:
    """``module or file -> sha256`` of the roots and everything of ours they reach."""
    found: dict[str, str] = {}
    pending = list(roots)
    seen: set[str] = set()
    own = _own_packages(roots)
    if search is None:
        search = [*sys.path, *(p for r in roots for p in plugin_search_path(r))]
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
        modules, files = _references(name, path, own)
        pending.extend(sorted(modules - seen))
        package = name.rpartition(".")[0]
        for file in sorted(files):
            found[f"{package}/{file.name}"] = hashlib.sha256(file.read_bytes()).hexdigest()
    return dict(sorted(found.items()))


def environment_code_hashes(
    task: str,
    search: Sequence[str] | None = None,
    *,
    service: bool = False,
    hooks: Sequence[str] = (),
) -> dict[str, str]:
    """The code of the environment ``task`` (built-in, plugin or service client), its
    verifier, and the modules of its contract's lifecycle ``hooks``."""
    return code_hashes([environment_module(task, search, service=service), *hooks], search)


def digest(hashes: dict[str, str]) -> str:
    """One sha256 for a set of file hashes (sorted ``name sha256`` lines)."""
    lines = "".join(f"{name} {sha}\n" for name, sha in sorted(hashes.items()))
    return hashlib.sha256(lines.encode()).hexdigest()


def verifier_hash(references: Sequence[str], search: Sequence[str] | None = None) -> str | None:
    """The pinned hash of the verifier(s) named by ``module:function`` references."""
    modules = sorted({r.partition(":")[0] for r in references})
    return digest(code_hashes(modules, search)) if modules else None


def environment_verifier_hash(
    task: str, search: Sequence[str] | None = None, *, service: bool = False
) -> str | None:
    """The verifier hash of an environment, from its module's ``VERIFIER`` reference."""
    module = environment_module(task, search, service=service)
    path = module_file(module, [*(search or sys.path), *plugin_search_path(module)])
    if path is None:
        raise EnvironmentCodeError(f"environment {task!r}: module {module} has no source file")
    for node in ast.parse(path.read_bytes()).body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "VERIFIER" for t in node.targets)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            return verifier_hash([node.value.value], search)
    return None
