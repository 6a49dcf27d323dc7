"""The "Train a black-box agent" guide: its example runs, and what it shows is what ships."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from execution_loop.sandboxes import bubblewrap_problem
from triloop.contracts import load_contract
from triloop.run_config import load_run_config

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "black-box-agents.md"
EXAMPLE = ROOT / "examples" / "black-box-agent"
CONTRACT = ROOT / "execution_loop" / "environments" / "contracts" / "tool_arithmetic_agent.yaml"


@pytest.mark.slow
def test_the_guides_example_plays_an_episode_through_the_gateway() -> None:
    done = subprocess.run([sys.executable, str(EXAMPLE / "play_one_episode.py")],
                          capture_output=True, text=True, timeout=900, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    shown = json.loads(done.stdout)
    assert shown["agent_exit_code"] == 0
    assert shown["sandbox"] == ("local" if bubblewrap_problem() else "bubblewrap")
    # The agent asks the model, compresses after two turns, then asks again.
    assert [kind for kind, _rule, _api in shown["calls"]] == [
        "main", "main", "compression", "main"]
    assert shown["segments"] == 2 and [b["call"] for b in shown["breaks"]] == [2]
    assert len(shown["steps"]) == 3
    assert all(step["mask_is_exactly_the_sampled_ids"] for step in shown["steps"])


def test_what_the_guide_shows_is_what_ships() -> None:
    guide = GUIDE.read_text()
    # Every file the guide names exists.
    for path in re.findall(r"`((?:examples|execution_loop|tests|docs)/[\w/.-]+)`", guide):
        assert (ROOT / path).exists(), path
    # The agent section it prints is the shipped contract's.
    block = re.search(r"```yaml\n(.*?)```", guide, re.S)
    assert block is not None
    shown = yaml.safe_load(block.group(1))
    written = yaml.safe_load(CONTRACT.read_text())
    assert shown["agent"] == written["agent"] and shown["fixtures"] == written["fixtures"]
    assert load_contract(CONTRACT).agent is not None
    # The run config it submits is valid and names no agent: the task's contract does.
    run = load_run_config((EXAMPLE / "run.yaml").read_text())
    assert run.rollout.task_ids == ["TASK_ID"]
    assert "agent" not in yaml.safe_load((EXAMPLE / "run.yaml").read_text())
