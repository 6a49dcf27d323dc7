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

A verifier module may name installed distributions it imports (``VERIFIER_DISTRIBUTIONS
= ("reasoning-gym",)``, a literal tuple of distribution names): the verifier interpreter
then imports their top-level packages and those of their installed requirements, and
nothing else from site-packages. Each named distribution counts in the walk as one entry,
``distribution:<name>``, the sha256 of its version, every file of its top-level packages
(source and data, read from disk, so an edited file counts) and the name and version of
each requirement it pulls in; a changed reasoning-gym is a new environment version and a
new verifier hash. Requirements count by version only: hashing sympy and numpy file by
file at every registration would cost seconds for files a pinned version already names.

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
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

ENVIRONMENTS_PACKAGE = "execution_loop.environments"
PLUGIN_GROUP = "triloop.environments"  # entry points: name = "package.module:Class"
SERVICE_MODULE = f"{ENVIRONMENTS_PACKAGE}.service"  # the client of a served environment
_OWN = "execution_loop"
PROTOCOL_MODULE = "triloop_environment_protocol"  # the environment service's models
_REFERENCE = re.compile(r"^(\w+(?:\.\w+)+):\w+$")
DISTRIBUTIONS_NAME = "VERIFIER_DISTRIBUTIONS"  # module constant: distributions it imports
_DISTRIBUTION_KEY = "distribution:"
_SKIPPED_FILES = ("__pycache__", ".pyc")
# CPython 3.11 keeps the AST constructor's recursion depth in per-interpreter state, not
# per thread: two threads parsing at once (the execution worker reads a verifier's
# VERIFIER_DISTRIBUTIONS on each episode's and admission probe's thread) can fail with
# "SystemError: AST constructor recursion depth mismatch" (python/cpython#106905). So
# every parse here takes this lock; a parse is milliseconds.
_PARSE_LOCK = threading.Lock()


def parse_source(source: bytes) -> ast.Module:
    """``ast.parse``, one thread at a time (see ``_PARSE_LOCK``)."""
    with _PARSE_LOCK:
        return ast.parse(source)


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
    for node in _nodes(parse_source(path.read_bytes())):
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
        for distribution in declared_distributions(path):
            found[_DISTRIBUTION_KEY + distribution] = distribution_hash(distribution, search)
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
    for node in parse_source(path.read_bytes()).body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "VERIFIER" for t in node.targets)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            return verifier_hash([node.value.value], search)
    return None


def declared_distributions(path: Path) -> tuple[str, ...]:
    """The distributions a module's ``VERIFIER_DISTRIBUTIONS`` names (read, not imported)."""
    for node in parse_source(path.read_bytes()).body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == DISTRIBUTIONS_NAME for t in targets):
                try:
                    value = ast.literal_eval(node.value) if node.value is not None else None
                except ValueError:
                    value = None
                if not isinstance(value, tuple | list) or not all(
                    isinstance(v, str) and v for v in value
                ):
                    raise EnvironmentCodeError(
                        f"{path}: {DISTRIBUTIONS_NAME} must be a literal tuple of "
                        "distribution names"
                    )
                return tuple(value)
    return ()


def _normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _distribution(name: str, search: Sequence[str] | None) -> metadata.Distribution:
    found = list(metadata.distributions(name=name, path=list(search or sys.path)))
    if not found:
        raise EnvironmentCodeError(
            f"distribution {name!r} named by a verifier's {DISTRIBUTIONS_NAME} is not installed"
        )
    return found[0]


def _requirements(distribution: metadata.Distribution) -> list[str]:
    """Names of the distribution's requirements outside extras (markers read loosely: a
    requirement for another platform is simply not installed, and is skipped)."""
    names = []
    for requirement in distribution.requires or []:
        spec, _, marker = requirement.partition(";")
        if "extra" in marker:
            continue
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
        if match:
            names.append(match.group(1))
    return names


def _closure(
    names: Sequence[str], search: Sequence[str] | None
) -> dict[str, metadata.Distribution]:
    """The named distributions and every installed requirement they pull in, by name."""
    found: dict[str, metadata.Distribution] = {}
    pending = [(name, True) for name in names]
    while pending:
        name, named = pending.pop()
        key = _normalised(name)
        if key in found:
            continue
        try:
            distribution = _distribution(name, search)
        except EnvironmentCodeError:
            if named:
                raise
            continue  # a requirement for another platform or Python
        found[key] = distribution
        pending.extend((requirement, False) for requirement in _requirements(distribution))
    return dict(sorted(found.items()))


def _top_level(distribution: metadata.Distribution) -> list[str]:
    """The importable top-level names a distribution installs."""
    text = distribution.read_text("top_level.txt")
    if text:
        candidates = text.split()
    else:
        candidates = [
            str(file).split("/")[0].split(".")[0]
            for file in distribution.files or []
            if not str(file).startswith("..")
        ]
    return sorted({c for c in candidates if c.isidentifier()})


def _top_level_paths(distribution: metadata.Distribution) -> list[Path]:
    folder = Path(str(distribution.locate_file(""))).resolve()
    paths: list[Path] = []
    for name in _top_level(distribution):
        if (folder / name).is_dir():
            paths.append(folder / name)
        paths += sorted(p for p in folder.glob(f"{name}.*") if p.is_file())
    return paths


def distribution_hash(name: str, search: Sequence[str] | None = None) -> str:
    """sha256 of a named distribution: version, its packages' files, its requirements."""
    closure = _closure([name], search)
    distribution = closure.pop(_normalised(name))
    lines = [f"version {distribution.version}"]
    for top in _top_level_paths(distribution):
        files = sorted(top.rglob("*")) if top.is_dir() else [top]
        for file in files:
            if file.is_file() and not any(part in _SKIPPED_FILES for part in file.parts) \
                    and file.suffix != ".pyc":
                relative = file.relative_to(top.parent).as_posix()
                lines.append(f"{relative} {hashlib.sha256(file.read_bytes()).hexdigest()}")
    lines += [f"requires {key}=={d.version}" for key, d in closure.items()]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


@dataclass(frozen=True)
class VerifierImports:
    """What a verifier interpreter may import beyond the standard library and ours:
    ``packages`` maps each allowed top-level name to the folder it is installed in."""

    packages: dict[str, str]

    @property
    def folders(self) -> list[str]:
        return sorted(set(self.packages.values()))


def verifier_imports(
    distributions: Sequence[str], search: Sequence[str] | None = None
) -> VerifierImports:
    """The top-level packages of the named distributions and of their requirements."""
    packages: dict[str, str] = {}
    for distribution in _closure(distributions, search).values():
        folder = str(Path(str(distribution.locate_file(""))).resolve())
        for name in _top_level(distribution):
            packages.setdefault(name, folder)
    return VerifierImports(dict(sorted(packages.items())))
