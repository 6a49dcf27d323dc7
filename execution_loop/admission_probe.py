"""``probe_admission``: the evidence governance's AdmissionWorkflow judges, gathered here.

The execution loop owns environments, so it measures; governance only judges
(``governance_loop.admission``). For one task (environment version + seed):

1. reproducible: reset with the seed, act once (a mistake to recover from), reset
   again, ... and record each reset's state fingerprint;
2. cheap recovery: the wall-clock seconds of each of those resets;
3. verifiable: every reference run's verdict must come from a verifier that ran in
   its own interpreter. The environments get a sandbox that records each command;
   a run counts as verified out of process only if a verifier command went through
   it. The verifier hash is the sha256 of the source of the verifier module named in
   that command's request;
4. repeatable: the environment's reference solution, played ``reference_runs``
   times, and the verifier's verdict on each.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from temporalio import activity

from execution_loop.policies import OpenedTask, TaskEnvironments
from execution_loop.sandbox import LocalProcessSandbox, SandboxBackend, SandboxLimits, SandboxResult
from triloop.contracts import EnvironmentContract
from triloop.workflow_api import (
    PROBE_ADMISSION_ACTIVITY,
    AdmissionProbeEvidence,
    AdmissionProbeInput,
)

ReferenceLookup = Callable[[str, int, EnvironmentContract], list[str]]
_VERIFIER_ENTRY = "child_main"  # what execution_loop.verification runs in its interpreter


class RecordingSandbox:
    """A sandbox that runs commands through another one and remembers verifier requests."""

    def __init__(self, inner: SandboxBackend | None = None) -> None:
        self._inner = inner or LocalProcessSandbox()
        self.verifier_references: list[str] = []

    def run(
        self,
        argv: Sequence[str],
        *,
        limits: SandboxLimits,
        workdir: Path | None = None,
        stdin: str = "",
        extra_env: Mapping[str, str] | None = None,
    ) -> SandboxResult:
        """Run the command; note which verifiers it asked for when it is a verifier."""
        if any(_VERIFIER_ENTRY in part for part in argv):
            try:
                requests = json.loads(stdin).get("requests", [])
                self.verifier_references += [str(r["verifier"]) for r in requests]
            except (ValueError, AttributeError, KeyError, TypeError):
                self.verifier_references.append("<unreadable request>")
        return self._inner.run(
            argv, limits=limits, workdir=workdir, stdin=stdin, extra_env=extra_env
        )


def module_source_sha256(reference: str) -> str:
    """sha256 of the source file of the module in a ``module:function`` reference."""
    module = reference.partition(":")[0]
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise LookupError(f"verifier module {module!r} cannot be found")
    return hashlib.sha256(Path(spec.origin).read_bytes()).hexdigest()


def verifier_hash(references: Sequence[str]) -> str | None:
    """The hash of the verifier module; several modules hash as their sorted list."""
    modules = sorted({r.partition(":")[0] for r in references})
    if not modules:
        return None
    if len(modules) == 1:
        return module_source_sha256(modules[0])
    lines = "".join(f"{m} {module_source_sha256(m)}\n" for m in modules)
    return hashlib.sha256(lines.encode()).hexdigest()


def _default_reference(name: str, seed: int, contract: EnvironmentContract) -> list[str]:
    from execution_loop.environments.registry import reference_solution

    return reference_solution(name, seed, contract)


class AdmissionProbe:
    """The admission evidence activity, bound to the task environments."""

    def __init__(
        self, *, environments: TaskEnvironments, reference: ReferenceLookup | None = None
    ) -> None:
        self._environments = environments
        self._reference = reference or _default_reference

    @activity.defn(name=PROBE_ADMISSION_ACTIVITY)
    def probe_admission(self, request: AdmissionProbeInput) -> AdmissionProbeEvidence:
        """Reset, recover and replay the reference solution; report what was observed."""
        task = self._environments.task(request.task_id, pending_ok=True)
        evidence = AdmissionProbeEvidence(
            task_id=task.task_id, environment_version_id=task.environment_version_id,
            environment=task.contract.task, seed=task.seed,
        )
        actions = self._reference(task.contract.task, task.seed, task.contract)
        self._resets(task, actions, max(request.resets, 0), evidence)
        references: list[str] = []
        verified_outside = request.reference_runs > 0
        for run in range(request.reference_runs):
            activity.heartbeat(run)
            recorder = RecordingSandbox()
            success, reward = self._reference_run(task, actions, recorder)
            evidence.reference_results.append(success)
            evidence.reference_rewards.append(reward)
            if not recorder.verifier_references:
                verified_outside = False
                evidence.notes.append(
                    f"reference run {run}: the verdict did not come from a verifier process"
                )
            references += recorder.verifier_references
        evidence.verifier_ran_out_of_process = verified_outside
        evidence.verifier_hash = verifier_hash(references)
        return evidence

    def _resets(
        self, task: OpenedTask, actions: list[str], count: int, evidence: AdmissionProbeEvidence
    ) -> None:
        env = task.open()
        try:
            for index in range(count):
                if index and actions:
                    env.step(actions[0])  # change the state, so the next reset must recover
                started = time.perf_counter()
                env.reset(task.seed)
                evidence.reset_seconds.append(time.perf_counter() - started)
                evidence.reset_fingerprints.append(env.state_fingerprint())
        finally:
            env.close()

    def _reference_run(
        self, task: OpenedTask, actions: list[str], sandbox: RecordingSandbox
    ) -> tuple[bool, float]:
        env = task.open(sandbox=sandbox)
        try:
            env.reset(task.seed)
            rewards = 0.0
            for action in actions:
                result = env.step(action)
                rewards += result.reward
                if result.done:
                    break
            outcome = env.outcome()
        finally:
            env.close()
        return outcome.success, rewards + outcome.reward


__all__ = ["AdmissionProbe", "RecordingSandbox", "verifier_hash"]
