"""Install the out-of-tree example environment for a test, from its local source only.

The package in ``examples/letter-count-env`` is built with the setuptools already in the
locked dependency set (no build isolation, no index: nothing is downloaded) into a
target folder. The test puts that folder on ``sys.path``; the registry then finds the
``triloop.environments`` entry point in its ``dist-info`` like any installed package's,
and the verifier interpreter gets the folder on its path from the entry point.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "letter-count-env"


def install_example(into: Path, source: Path = EXAMPLE) -> Path:
    """Build and install an example package into ``into/site``; returns that folder."""
    # Copied first: a setuptools build writes build/ and *.egg-info beside the sources.
    work = into / "src"
    shutil.copytree(source, work, ignore=shutil.ignore_patterns("build", "*.egg-info",
                                                                "__pycache__"))
    site = into / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
         "--no-build-isolation", "--disable-pip-version-check", "--target", str(site),
         str(work)],
        check=True, capture_output=True, text=True,
    )
    return site


def forget_plugins() -> None:
    """Drop the registry's loaded plugins, so packages installed since are found."""
    from execution_loop.environments import registry

    registry._plugin.cache_clear()
    registry.load_builtin_contract.cache_clear()


@contextmanager
def on_path(site: Path) -> Iterator[None]:
    """The installed folder on ``sys.path``, with the registry's plugin cache fresh."""
    sys.path.insert(0, str(site))
    forget_plugins()
    try:
        yield
    finally:
        sys.path.remove(str(site))
        forget_plugins()
