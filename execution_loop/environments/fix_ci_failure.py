"""fix_ci_failure: make a pinned repository's failing CI pass, without skipping tests.

Each episode gets a fresh working copy of a repository built from the contract's
fixture at its pinned commit (``ci_repo.build_repository``). ``repository_fixture``
is a folder of repositories and ``commits`` pins each (``NAME@COMMIT ...``); the seed
picks one (``seed % count``, in name order), so seeds give different repositories and
bugs. One action per turn, the command on the first line:

- ``run_tests`` (allowed action ``retry_ci``): run ``python run_tests.py`` in the
  sandbox (bubblewrap where it works: it sees only the working copy, where the runner's
  report lands and is removed once read); the observation carries
  ``command_exit_code``, ``test_report`` and ``ci_log`` as the contract lists them. A
  green run ends the episode.
- ``cat <file>`` (``read_source``): show a file.
- ``edit <file>`` then the full new content (``edit_source``), or ``replace <file>``
  then ``<<<<<<< SEARCH`` / ``=======`` / ``>>>>>>> REPLACE`` lines.
- ``skip_test <name>`` (``skip_test``): list the test in ``ci_skip.txt``; the
  verifier counts every skipped test as a new failure.

The verifier, in its own process, rebuilds the pinned repository, puts the agent's
code beside the pinned tests and runner (edits to those, and any ``conftest.py`` or
config file the agent adds, are ignored and reported) and runs the whole suite with
pytest in a process it starts (``ci_verifier``, ``ci_suite``): nothing the agent's CI
run printed or wrote is trusted.

Stdlib only at run time (the verifier imports this module without site-packages).
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from execution_loop.environments import ci_repo
from execution_loop.environments.base import (
    EnvironmentStateError,
    Outcome,
    StepResult,
    TaskCapabilities,
    TaskContent,
    fingerprint,
    refuse_item,
)
from execution_loop.environments.ci_actions import Action, apply_action, parse_action
from execution_loop.sandbox import LocalProcessSandbox, SandboxBackend, SandboxLimits
from execution_loop.sandboxes import default_sandbox, python_dependencies
from execution_loop.verification import VerifierRequest, run_verifier

if TYPE_CHECKING:
    from triloop.contracts import EnvironmentContract

VERIFIER = "execution_loop.environments.ci_verifier:verify"
REPORT_FILE = ".triloop-ci-report.json"  # where the agent's CI run writes its report
CAPABILITIES = TaskCapabilities(
    actions=frozenset({"retry_ci", "read_source", "edit_source", "skip_test"}),
    observations=frozenset({"ci_log", "test_report", "command_exit_code"}),
    success_criteria=frozenset({"all_tests_pass", "no_new_failures", "coverage_drop_lt"}),
    outcome_terms=frozenset({"success", "failure"}),
    process_terms=frozenset({"valid_action", "invalid_action"}),
    initial_state=dict.fromkeys(
        ("repository", "dependencies", "fixtures", "repository_fixture", "commits"), (str,)
    ),
    required_state=frozenset({"repository_fixture", "commits"}),
)
_HELP = {
    "retry_ci": "run_tests",
    "read_source": "cat <file>",
    "edit_source": "edit <file> + the full new content on the next lines | replace <file> "
    "+ <<<<<<< SEARCH / ======= / >>>>>>> REPLACE lines",
    "skip_test": "skip_test <name>",
}


class FixCiFailure:
    """The fix_ci_failure environment bound to a contract."""

    def __init__(
        self, contract: EnvironmentContract, *, sandbox: SandboxBackend | None = None
    ) -> None:
        self.contract = contract
        # Bubblewrap: the agent's CI runs see only the working copy (fails closed).
        self._sandbox = sandbox or default_sandbox(allow_unisolated=contract.allows_unisolated)
        self._repositories = contract.fixture_path(
            str(contract.initial_state["repository_fixture"])
        )
        self._commits = pinned_commits(contract)
        self._fixture, self._commit = self._repositories, ""
        spec = contract.sandbox
        self._limits = SandboxLimits(
            cpu_time_s=spec.cpu_time_s,
            memory_bytes=spec.memory_mb * 2**20,
            wall_time_s=spec.wall_time_s,
            max_output_bytes=spec.max_output_bytes,
        )
        self._tmp: Path | None = None
        self._turn = 0
        self._done = False
        self._skipped: list[str] = []
        self._ended_by: str | None = None
        self._deadline = 0.0

    @property
    def workdir(self) -> Path:
        """The episode's working copy."""
        if self._tmp is None:
            raise EnvironmentStateError("call reset(seed) first")
        return self._tmp / "repo"

    @property
    def sandbox_backend(self) -> SandboxBackend:
        """Where the agent's commands run (recorded with each episode)."""
        return self._sandbox

    def reset(self, seed: int, item: Mapping[str, Any] | None = None) -> str:
        """A fresh working copy of the seed's repository at its pinned commit, and its CI run."""
        refuse_item("fix_ci_failure", item)
        self.close()
        name = repository_for(seed, self._commits)
        self._fixture, self._commit = self._repositories / name, self._commits[name]
        self._tmp = Path(tempfile.mkdtemp(prefix="triloop-fix-ci-"))
        # Searchable, not listable: bubblewrap, started as the sandbox user, binds repo/.
        self._tmp.chmod(0o711)
        commit = ci_repo.build_repository(self._fixture, self.workdir)
        if commit != self._commit:
            raise ci_repo.FixtureError(
                f"fixture {self._fixture} builds commit {commit} but the contract pins "
                f"{self._commit}: the fixture changed; register a new contract version"
            )
        self._turn, self._done, self._skipped, self._ended_by = 0, False, [], None
        self._deadline = time.monotonic() + self.contract.limits.wall_time_s
        files = ", ".join(
            p.relative_to(self.workdir).as_posix() for p in ci_repo.regular_files(self.workdir)
        )
        actions = "\n".join(f"  {_HELP[a]}" for a in self.contract.allowed_actions)
        head = (
            f"CI is failing at commit {commit[:12]}. Make it pass without skipping tests."
            f"\nfiles: {files}\nactions:\n{actions}\n"
        )
        return head + self._run_ci()[0]

    def step(self, action: str) -> StepResult:
        """Apply one command to the working copy."""
        if self._tmp is None:
            raise EnvironmentStateError("call reset(seed) first")
        if self._done:
            raise EnvironmentStateError("the episode is over; call reset(seed) to start another")
        self._turn += 1
        parsed = parse_action(action)
        feedback: dict[str, Any] = {"valid_action": False, "action": None}
        if isinstance(parsed, str):
            observation = f"invalid action: {parsed}"
        elif parsed.kind not in self.contract.allowed_actions:
            observation = f"invalid action: {parsed.kind} is not allowed in this environment"
        else:
            observation = self._apply(parsed, feedback)
        if not self._done and self._turn >= self.contract.limits.max_turns:
            self._ended_by, self._done = "max_turns", True
        if not self._done and time.monotonic() > self._deadline:
            self._ended_by, self._done = "wall_time", True
        truncated = self._ended_by in ("max_turns", "wall_time")
        feedback.update(
            ended_by=self._ended_by,
            failure="sandbox_limit" if self._ended_by == "sandbox_limit" else None,
            truncated=self._ended_by if truncated else None,
        )
        terms = self.contract.reward.process
        reward = terms.get("valid_action" if feedback["valid_action"] else "invalid_action", 0.0)
        return StepResult(observation, reward, self._done, feedback)

    def _apply(self, action: Action, feedback: dict[str, Any]) -> str:
        if action.kind == "retry_ci":
            observation, run = self._run_ci()
            feedback.update(
                valid_action=True,
                action="retry_ci",
                exit_code=run.exit_code,
                sandbox_limit=run.limit_exceeded,
            )
            if run.limit_exceeded:
                self._ended_by, self._done = "sandbox_limit", True
            elif run.exit_code == 0:  # CI is green: the agent is done; the verifier decides
                self._ended_by, self._done = "ci_green", True
            return observation
        result = apply_action(action, self.workdir)
        feedback.update(valid_action=result.ok, action=action.kind, path=action.target)
        if result.ok and action.kind == "skip_test":
            self._skipped.append(action.target)
        return result.observation

    def _run_ci(self) -> tuple[str, ci_repo.CiRun]:
        # The working copy is the one folder the sandbox may write, so the runner's report
        # lands there; it is read as the agent's output and removed at once, so it never
        # shows among the agent's files nor reaches the verifier's candidate tree.
        report = self.workdir / REPORT_FILE
        try:
            run = ci_repo.run_ci(self._sandbox, self.workdir, report, self._limits)
        finally:
            ci_repo.discard(report)
        shown = self.contract.observations
        parts = [f"$ python {ci_repo.RUNNER}"]
        if "command_exit_code" in shown:
            parts.append(f"command_exit_code: {run.exit_code}")
        if run.limit_exceeded:
            parts.append(f"sandbox limit exceeded: {run.limit_exceeded}")
        if "test_report" in shown:
            parts.append(f"test_report: {ci_repo.summarise(run)}")
        if "ci_log" in shown:
            parts.append(f"ci_log:\n{run.log.rstrip()}")
        return "\n".join(parts), run

    def verifier_request(self) -> VerifierRequest:
        """Where the working copy and the pinned fixture are, and what success means."""
        criteria = self.contract.success_criteria
        payload = {
            "fixture": str(self._fixture),
            "commit": self._commit,
            "workdir": str(self.workdir),
            "skipped": sorted(set(self._skipped)),
            "criteria": {
                "all_tests_pass": criteria.all_tests_pass,
                "no_new_failures": criteria.no_new_failures,
                "coverage_drop_lt": criteria.coverage_drop_lt,
            },
            "limits": dataclasses.asdict(self._limits),
            "ended_by": self._ended_by,
            "reward": dict(self.contract.reward.outcome),
            # The verifier's pytest run of the agent's code: the same backend as the
            # episode's commands (a Docker one falls back to local), with pytest's folders.
            "sandbox": "bubblewrap" if self._sandbox.name == "bubblewrap" else "local",
            "dependencies": [str(folder) for folder in python_dependencies()],
        }
        return VerifierRequest(VERIFIER, payload)

    def outcome(self) -> Outcome:
        """The verifier re-runs the pinned tests against the agent's code, in its own process."""
        limits = SandboxLimits(
            cpu_time_s=60,
            memory_bytes=2 * 2**30,
            wall_time_s=2 * self._limits.wall_time_s + 60,
            max_output_bytes=2**20,
        )
        # The verifier is triloop's code and must read the working copy, which a backend
        # that hides the filesystem would hide: there it runs as a local process of its
        # own and runs the agent's code under ``payload["sandbox"]``. A local backend (the
        # admission probe's recording one among them) still sees the verifier's command.
        runner = self._sandbox if self._sandbox.name == "local" else LocalProcessSandbox()
        return run_verifier(self.verifier_request(), limits=limits, sandbox=runner)

    def state_fingerprint(self) -> str:
        """sha256 of the working copy's files (not .git), the turn and whether it is over."""
        files = {
            p.relative_to(self.workdir).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in ci_repo.regular_files(self.workdir)
        }
        return fingerprint({"files": files, "turn": self._turn, "done": self._done})

    def close(self) -> None:
        """Remove the working copy."""
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


def pinned_commits(contract: EnvironmentContract) -> dict[str, str]:
    """Repository name -> pinned commit, from ``initial_state.commits`` (``NAME@COMMIT ...``)."""
    pairs = [entry.partition("@") for entry in str(contract.initial_state["commits"]).split()]
    commits = {name: commit for name, _, commit in pairs}
    if not pairs or len(commits) != len(pairs) or not all(n and c for n, _, c in pairs):
        raise ci_repo.FixtureError(
            "initial_state.commits must list NAME@COMMIT once for each repository folder, "
            f"got {contract.initial_state['commits']!r}"
        )
    return commits


def repository_for(seed: int, commits: dict[str, str]) -> str:
    """The repository a seed plays: ``seed % count`` in name order."""
    names = sorted(commits)
    return names[seed % len(names)]


# The built-in repositories' bugs and their fixes: (file, search, replacement).
_FIXES: dict[str, list[tuple[str, str, str]]] = {
    "shop": [
        ("shop/pricing.py", "    if quantity > 50:", "    if quantity >= 50:"),
        ("shop/pricing.py", "    return amount * percent // 100",
         "    return amount * (100 - percent) // 100"),
    ],
    "ledger": [
        ("ledger/balance.py", '        elif kind == "debit":\n            total += amount',
         '        elif kind == "debit":\n            total -= amount'),
        ("ledger/balance.py", "    return max(debits)", "    return max(debits, default=0)"),
    ],
    "units": [
        ("units/convert.py", "    return celsius * 9 / 5 + 23", "    return celsius * 9 / 5 + 32"),
        ("units/convert.py", "            total += int(number) * _SECONDS[char]",
         '            total += int(number) * _SECONDS[char]\n            number = ""'),
    ],
}


def describe(
    seed: int, item: Mapping[str, Any] | None, contract: EnvironmentContract
) -> TaskContent:
    """The task is its repository: the fixture's bytes (the failing tests among them) at
    the pinned commit. ``seed % count`` picks the repository, so seeds 0 and 3 are the same
    task and share one content digest."""
    refuse_item("fix_ci_failure", item)
    commits = pinned_commits(contract)
    name = repository_for(seed, commits)
    fixture = contract.fixture_path(str(contract.initial_state["repository_fixture"])) / name
    files = ci_repo.fixture_digests(fixture)
    tests = sorted(path for path in files if path.rsplit("/", 1)[-1].startswith("test_"))
    return TaskContent(
        {"environment": "fix_ci_failure", "commit": commits[name], "files": files,
         "tests": tests},
        {"repository": name},
    )


def reference_solution(
    seed: int, contract: EnvironmentContract, item: Mapping[str, Any] | None = None
) -> list[str]:
    """The seed's repository's one-line fixes, then a green CI run."""
    refuse_item("fix_ci_failure", item)
    fixes = _FIXES[repository_for(seed, pinned_commits(contract))]
    return [
        f"replace {path}\n<<<<<<< SEARCH\n{old}\n=======\n{new}\n>>>>>>> REPLACE"
        for path, old, new in fixes
    ] + ["run_tests"]
