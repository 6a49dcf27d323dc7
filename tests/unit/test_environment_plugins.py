"""Environments from installed packages: the ``triloop.environments`` entry-point group."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from execution_loop.environments import registry
from execution_loop.environments.plugins import PluginError
from execution_loop.verification import VerifierRequest, run_verifier
from tests.environment_plugins import forget_plugins, install_example, on_path
from triloop.contracts import ContractError, contract_id, load_contract
from triloop.environment_code import environment_code_hashes, environment_verifier_hash


@pytest.fixture(scope="module")
def example_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example package, installed from its local source once for the module."""
    return install_example(tmp_path_factory.mktemp("plugin"))


@pytest.fixture
def installed(example_site: Path) -> Iterator[Path]:
    """The example's installed folder, on the path for one test."""
    with on_path(example_site):
        yield example_site


def contract_of(site: Path) -> Path:
    return site / "letter_count_env" / "contract.yaml"


def fake_distribution(site: Path, name: str, entry: str) -> None:
    """A dist-info declaring one environment entry point (no code of its own)."""
    info = site / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[triloop.environments]\n{entry}\n")


def test_without_the_package_there_is_no_such_environment() -> None:
    forget_plugins()
    assert "letter_count" not in registry.list_environments()
    with pytest.raises(registry.UnknownEnvironmentError):
        registry.get_environment("letter_count")


def test_an_installed_package_provides_an_environment_and_its_verifier(installed: Path) -> None:
    assert "letter_count" in registry.list_environments()
    assert not registry.is_builtin("letter_count")
    assert registry.plugin_source("letter_count") == (
        "letter-count-env: letter_count_env.environment:LetterCount")
    contract = load_contract(contract_of(installed), capabilities=registry.capabilities())
    env = registry.make_environment(contract)
    first = env.reset(7)
    assert first == env.reset(7) and "occur in" in first
    [answer] = registry.reference_solution("letter_count", 7, contract)
    assert env.step(answer).done
    outcome = env.outcome()
    assert outcome.success and outcome.reward == 1.0
    env.reset(7)
    env.step("answer: 99")
    assert not env.outcome().success


def test_the_plugin_code_is_in_the_version_and_its_verifier_is_pinned(installed: Path) -> None:
    code = environment_code_hashes("letter_count")
    assert "letter_count_env.environment" in code
    assert "execution_loop.verification" in code  # what the plugin's verdicts run through
    pinned = environment_verifier_hash("letter_count")
    assert pinned is not None and len(pinned) == 64
    contract = load_contract(contract_of(installed))
    before = contract_id(contract)
    module = installed / "letter_count_env" / "environment.py"
    original = module.read_text()
    try:
        module.write_text(original.replace('if success else', 'if True else'))
        assert contract_id(contract) != before  # changed reward logic: a new version
        assert environment_verifier_hash("letter_count") != pinned
    finally:
        module.write_text(original)


def test_a_contract_the_plugin_cannot_honour_is_refused(installed: Path) -> None:
    text = contract_of(installed).read_text().replace("[answer]", "[answer, run_python]")
    bad = installed.parent / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(ContractError, match="letter_count has no action 'run_python'"):
        load_contract(bad, capabilities=registry.capabilities())


def test_verifiers_outside_our_environments_and_plugins_are_refused(installed: Path) -> None:
    del installed
    for reference in ("os:system", "subprocess:run", "letter_count_env.environment"):
        with pytest.raises(ValueError, match="installed environment plugin"):
            run_verifier(VerifierRequest(reference, {}))


def test_broken_or_clashing_plugins_are_named(tmp_path: Path) -> None:
    fake_distribution(tmp_path, "clash", "frozen_lake = letter_count_env.environment:LetterCount")
    fake_distribution(tmp_path, "ghost", "ghost_env = no_such_module.env:Ghost")
    with on_path(tmp_path):
        with pytest.raises(PluginError, match="takes the built-in name 'frozen_lake'"):
            registry.ensure_plugins_load()
        with pytest.raises(PluginError, match="ghost_env .* failed to load: ModuleNotFoundError"):
            registry.get_environment("ghost_env")


def test_a_plugin_module_missing_a_piece_is_named(tmp_path: Path) -> None:
    package = tmp_path / "half_env"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "env.py").write_text("class Half:\n    pass\nVERIFIER = 'half_env.env:verify'\n")
    fake_distribution(tmp_path, "half", "half_env = half_env.env:Half")
    with on_path(tmp_path):
        with pytest.raises(PluginError, match="needs CAPABILITIES"):
            registry.get_environment("half_env")
