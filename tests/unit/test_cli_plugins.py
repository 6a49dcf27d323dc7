"""The CLI mounts each installed package's commands and says which could not be loaded."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from triloop.cli import PLUGIN_COMMANDS, PLUGIN_GROUPS, _load, mount_plugins


@pytest.fixture
def packages(tmp_path: Path) -> Iterator[Path]:
    """A folder on sys.path for packages of the test's own."""
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in [m for m in sys.modules if m.startswith("plug_")]:
        del sys.modules[name]


def _package(root: Path, name: str, code: str) -> None:
    (root / name).mkdir()
    (root / name / "__init__.py").write_text(code)


def test_a_broken_plugin_is_named_with_its_cause_and_the_others_still_mount(
    packages: Path,
) -> None:
    _package(packages, "plug_good", "import typer\napp = typer.Typer()\n"
             "@app.command()\ndef hello() -> None:\n    print('hello')\n")
    _package(packages, "plug_broken", "import plug_missing_dependency\n")
    _package(packages, "plug_empty", "")
    root = typer.Typer()
    problems = mount_plugins(root, (
        ("good", "plug_good:app"), ("broken", "plug_broken:app"), ("empty", "plug_empty:app"),
        ("absent", "plug_not_installed.cli:app"),  # a package not installed: no problem
    ), (("gone", "plug_broken:command"),), {})
    assert problems == [
        "the `broken` commands are unavailable: plug_broken:app failed to import:"
        " ModuleNotFoundError: No module named 'plug_missing_dependency'",
        "the `empty` commands are unavailable: plug_empty:app is not Typer (got NoneType)",
        "the `gone` command is unavailable: plug_broken:command failed to import:"
        " ModuleNotFoundError: No module named 'plug_missing_dependency'",
    ]
    assert "hello" in CliRunner().invoke(root, ["good", "hello"]).output


def test_every_package_of_this_checkout_loads() -> None:
    # Loaded, not mounted: mounting merges the two `env` groups into the first one.
    for _name, target in PLUGIN_GROUPS:
        assert isinstance(_load(target, typer.Typer), typer.Typer), target
    for _name, target in PLUGIN_COMMANDS:
        assert callable(_load(target)), target
