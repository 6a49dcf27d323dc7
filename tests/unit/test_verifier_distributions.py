"""Verifiers that import installed packages: only the distributions they name (and what
those require), and the named distributions' files count in the verifier hash and the
environment version's code hashes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from execution_loop.verification import VerificationError, VerifierRequest, run_verifier
from tests.environment_plugins import install_example, on_path
from triloop.contracts import contract_id, load_contract
from triloop.environment_code import (
    EnvironmentCodeError,
    environment_code_hashes,
    verifier_hash,
    verifier_imports,
)

VERIFY = '''
from execution_loop.environments.base import Outcome


def verify(payload):
    import {module}
    return Outcome(success=True, reward=1.0, details={{"imported": {module}.__name__}})
'''


@pytest.fixture(scope="module")
def example_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_example(tmp_path_factory.mktemp("plugin"))


@pytest.fixture
def installed(example_site: Path) -> Iterator[Path]:
    with on_path(example_site):
        yield example_site


def write_verifier(site: Path, name: str, module: str, declared: str | None) -> str:
    """A verifier module in the installed plugin's package; returns its reference."""
    header = f"VERIFIER_DISTRIBUTIONS = {declared}\n" if declared is not None else ""
    (site / "letter_count_env" / f"{name}.py").write_text(header + VERIFY.format(module=module))
    return f"letter_count_env.{name}:verify"


def toy_distribution(site: Path, version: str = "1.0") -> Path:
    """An installed distribution ``toy-scorer`` with one package; returns its source file."""
    package = site / "toy_scorer"
    package.mkdir(parents=True, exist_ok=True)
    source = package / "__init__.py"
    source.write_text("def score(answer, expected):\n    return float(answer == expected)\n")
    for old in site.glob("toy_scorer-*.dist-info"):
        for file in old.iterdir():
            file.unlink()
        old.rmdir()
    info = site / f"toy_scorer-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: toy-scorer\nVersion: {version}\nRequires-Dist: PyYAML\n"
        "Requires-Dist: pytest ; extra == 'test'\n")
    (info / "top_level.txt").write_text("toy_scorer\n")
    return source


def test_a_verifier_imports_an_installed_package_only_when_it_names_it(installed: Path) -> None:
    undeclared = write_verifier(installed, "uses_yaml", "yaml", None)
    with pytest.raises(VerificationError, match="No module named 'yaml'"):
        run_verifier(VerifierRequest(undeclared, {}))
    declared = write_verifier(installed, "names_yaml", "yaml", '("PyYAML",)')
    outcome = run_verifier(VerifierRequest(declared, {}))
    assert outcome.success and outcome.details == {"imported": "yaml"}
    # Naming one distribution opens its packages and its requirements', nothing else.
    other = write_verifier(installed, "names_yaml_uses_tabulate", "tabulate", '("PyYAML",)')
    with pytest.raises(VerificationError, match="No module named 'tabulate'"):
        run_verifier(VerifierRequest(other, {}))


def test_the_named_packages_and_their_requirements_are_importable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    toy_distribution(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    imports = verifier_imports(["toy-scorer"])
    assert imports.packages["toy_scorer"] == str(tmp_path.resolve())
    assert "yaml" in imports.packages  # PyYAML, its requirement
    assert "pytest" not in imports.packages  # only under an extra


def test_a_named_distributions_source_is_in_the_verifier_hash_and_the_version(
    installed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = toy_distribution(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    reference = write_verifier(installed, "scored", "toy_scorer", '("toy-scorer",)')
    environment = installed / "letter_count_env" / "environment.py"
    original = environment.read_text()
    contract = load_contract(installed / "letter_count_env" / "contract.yaml")
    try:
        # The plugin's environment module runs its verdicts through the scored verifier.
        environment.write_text(original.replace(
            'VERIFIER = "letter_count_env.environment:verify"', f'VERIFIER = "{reference}"'))
        code = environment_code_hashes("letter_count")
        assert "distribution:toy-scorer" in code and "letter_count_env.scored" in code
        pinned, version = verifier_hash([reference]), contract_id(contract)
        assert pinned == verifier_hash([reference])  # the same files, the same hash

        source.write_text(source.read_text().replace("answer == expected", "True"))
        assert verifier_hash([reference]) != pinned
        assert contract_id(contract) != version  # a changed scorer is a new version
        edited = verifier_hash([reference])

        toy_distribution(tmp_path / "site", version="1.1")  # original source, new version
        assert verifier_hash([reference]) not in (pinned, edited)
    finally:
        environment.write_text(original)


def test_a_named_distribution_that_is_not_installed_is_named(installed: Path) -> None:
    reference = write_verifier(installed, "missing", "nothing_here", '("no-such-dist",)')
    with pytest.raises(EnvironmentCodeError, match="'no-such-dist'.*not installed"):
        verifier_hash([reference])
    with pytest.raises(EnvironmentCodeError, match="not installed"):
        run_verifier(VerifierRequest(reference, {}))
    bad = write_verifier(installed, "computed", "yaml", 'tuple(["PyYAML"])')
    with pytest.raises(EnvironmentCodeError, match="literal tuple of distribution names"):
        verifier_hash([bad])


def test_distributions_are_read_one_parse_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CPython 3.11's AST constructor is not safe in two threads at once (its recursion
    depth is per interpreter): the execution worker reads a verifier's distributions on
    every episode's thread, so its parses must not overlap."""
    import ast
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from triloop.environment_code import declared_distributions

    parse, lock = ast.parse, threading.Lock()
    at_once = {"now": 0, "most": 0}

    def watched(source: Any, *args: Any, **kwargs: Any) -> ast.Module:
        with lock:
            at_once["now"] += 1
            at_once["most"] = max(at_once["most"], at_once["now"])
        time.sleep(0.02)  # a slow parse: overlapping threads would show here
        try:
            parsed: ast.Module = parse(source, *args, **kwargs)
            return parsed
        finally:
            with lock:
                at_once["now"] -= 1

    monkeypatch.setattr(ast, "parse", watched)
    paths = []
    for i in range(6):
        path = tmp_path / f"verifier_{i}.py"
        path.write_text(f'VERIFIER_DISTRIBUTIONS = ("package-{i}",)\n')
        paths.append(path)
    with ThreadPoolExecutor(6) as pool:
        found = list(pool.map(declared_distributions, paths))
    assert found == [(f"package-{i}",) for i in range(6)]
    assert at_once["most"] == 1
