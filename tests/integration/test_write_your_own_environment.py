"""The "Write your own environment" guide's script runs as written against the example."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.environment_plugins import install_example

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "write-your-own-environment.md"

pytestmark = pytest.mark.integration


def guide_script() -> str:
    """The one Python block of the guide's "Try it" section."""
    section = GUIDE.read_text().split("## 3. Try it", 1)[1].split("## 4.", 1)[0]
    [block] = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    return block


def test_the_guides_example_runs_and_shows_what_it_says(tmp_path: Path) -> None:
    site = install_example(tmp_path)
    script = tmp_path / "try_it.py"
    script.write_text(guide_script())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert "letter_count" in shown["environments"] and shown["success"] is True
    assert shown["verified_by"] == ["letter_count_env.environment:verify"]
    assert re.fullmatch(r"[0-9a-f]{64}", shown["version"])
    assert "letter_count_env.environment" in shown["code"]
    assert re.fullmatch(r"[0-9a-f]{64}", shown["verifier_hash"])


def test_the_guide_names_files_that_exist() -> None:
    text = GUIDE.read_text()
    for path in re.findall(r"`((?:examples|tests|docs|execution_loop)/[\w./-]+)`", text):
        assert (ROOT / path).exists(), path
