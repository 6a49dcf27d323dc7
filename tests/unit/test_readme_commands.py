"""The README can be followed as written: every `triloop ...` command it shows exists, the
example runs name no placeholder, and the Temporal CLI line works against a plaintext
frontend."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from triloop.run_config import load_run_config

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()

# Every command path the `triloop` command mounts, printed by a fresh interpreter (mounting
# extends the groups in place, so it is done once and away from this process).
_COMMANDS = """
import json, click, typer
from triloop import cli
cli._mount_plugins()
def walk(command, path):
    yield " ".join(path), isinstance(command, click.Group)
    for name, sub in getattr(command, "commands", {}).items():
        yield from walk(sub, [*path, name])
print(json.dumps(dict(walk(typer.main.get_command(cli.app), []))))
"""


@pytest.fixture(scope="module")
def commands() -> dict[str, bool]:
    """Command path -> whether it is a group."""
    found = subprocess.run([sys.executable, "-c", _COMMANDS], capture_output=True, text=True,
                           check=True, cwd=ROOT)
    return dict(json.loads(found.stdout.strip().splitlines()[-1]))


def _readme_commands() -> list[str]:
    """Every `triloop` command line in the README's shell blocks and inline code."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        lines += [line for line in block.splitlines() if "bin/triloop " in line]
    lines += [span for span in re.findall(r"`([^`\n]+)`", README)
              if re.match(r"(\.venv/bin/)?triloop [a-z]", span)]
    return lines


def _command_path(line: str, commands: dict[str, bool]) -> str:
    words = line.split("triloop ", 1)[1].split()
    path: list[str] = []
    for word in words:
        if " ".join([*path, word]) not in commands:
            break
        path.append(word)
    return " ".join(path)


def test_every_command_the_readme_shows_exists(commands: dict[str, bool]) -> None:
    lines = _readme_commands()
    assert len(lines) > 40
    problems = []
    for line in lines:
        path = _command_path(line, commands)
        if not path or commands[path]:  # nothing matched, or it stops at a group
            problems.append(line)
    assert problems == []
    for needed in ("promotions sign-audit", "promotions reject-audit", "promotions approve",
                   "promotions reject", "promotions override", "deployments show",
                   "checkpoints list", "checkpoints show", "checkpoints lineage"):
        assert needed in commands and not commands[needed]


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "examples").glob("*.run.yaml")))
def test_the_example_runs_name_no_placeholder(name: str) -> None:
    text = (ROOT / "examples" / name).read_text()
    body = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    assert not re.search(r"\b[A-Z]+_ID\b", body), name
    load_run_config(text)  # valid as it stands


def test_the_first_run_submits_the_example_on_the_task_set_it_registers() -> None:
    section = README[README.index("## Your first run"):README.index("## Using it")]
    example = load_run_config((ROOT / "examples" / "tiny-frozen-lake.run.yaml").read_text())
    [selection] = example.rollout.task_sets
    assert f"--name {selection.task_set} " in section
    assert f"task-set admit {selection.task_set} --approve" in section
    assert "train submit examples/tiny-frozen-lake.run.yaml" in section
    steps = [line for line in section.splitlines() if "bin/triloop " in line]
    assert [s.split("triloop ", 1)[1].split()[:2] for s in steps] == [
        ["env", "register"], ["governance", "task-set"], ["governance", "task-set"],
        ["governance", "task-set"], ["governance", "task"], ["train", "submit"]]


def test_the_temporal_cli_lines_name_the_cached_binary_and_a_plaintext_frontend() -> None:
    lines = [span for span in re.findall(r"`([^`\n]+)`", README) if "workflow list" in span]
    assert lines
    for line in lines:
        assert line.startswith(".triloop/bin/temporal ") and "--tls=false" in line, line
        assert "--api-key" in line and "--address" in line, line
