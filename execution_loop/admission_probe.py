"""``probe_admission``: the evidence governance's AdmissionWorkflow judges, gathered here.

The execution loop owns environments, so it measures; governance only judges
(``governance_loop.admission``). For one task (environment version + seed):

1. reproducible: reset with the seed, act once (a mistake to recover from), reset
   again, ... and record each reset's state fingerprint;
2. cheap recovery: the wall-clock seconds of each of those resets;
3. verifiable: every reference run's verdict must come from a verifier that ran in
   its own interpreter. The environments get a sandbox that records each command;
   a run counts as verified out of process only if a verifier command went through
   it. The verifier hash is ``triloop.environment_code.verifier_hash`` of the
   verifier named in that command's request: its module and every module of ours it
   reaches, the same hash governance pins when it registers the version;
4. repeatable: the environment's reference solution, played ``reference_runs``
   times, and the verifier's verdict on each;
5. for question 2 as well: every known reward hack (``reward_hacks.LIBRARY``) played
   from a fresh reset, and whether the verifier paid for it.

Agent code never runs unisolated unless the stack or the contract says so, and admission
checks it first: a task whose agent (a contract's ``agent`` program, or the code its
environment runs for the policy) would have no sandbox here is refused, non-retryably, with
``SandboxUnavailable``'s message, which names Debian's ``bubblewrap`` package. Governance
records it as the probe's failure, so the task is not admissible. Where the code will run
unisolated because that was allowed, the evidence's notes say so and why.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from execution_loop.contracts import PROBE_ADMISSION
from execution_loop.environments.base import EnvironmentUnavailable, reset_task
from execution_loop.reward_hacks import probe_reward_hacks
from execution_loop.sandbox import LocalProcessSandbox, SandboxBackend, SandboxLimits, SandboxResult
from execution_loop.sandboxes import SandboxUnavailable, default_sandbox, describe
from execution_loop.serving import OpenedTask, TaskEnvironments
from triloop.contracts import EnvironmentContract
from triloop.environment_code import verifier_hash
from triloop.workflow_api import (
    AdmissionProbeEvidence,
    AdmissionProbeInput,
)

ReferenceLookup = Callable[..., list[str]]  # (name, seed, contract, item=None)
_VERIFIER_ENTRY = "child_main"  # what execution_loop.verification runs in its interpreter


class RecordingSandbox:
    """A sandbox that runs commands through another one and remembers verifier requests."""

    def __init__(self, inner: SandboxBackend | None = None) -> None:
        self._inner = inner or LocalProcessSandbox()
        self.name = self._inner.name
        self.verifier_references: list[str] = []

    def run(
        self,
        argv: Sequence[str],
        *,
        limits: SandboxLimits,
        workdir: Path | None = None,
        stdin: str = "",
        extra_env: Mapping[str, str] | None = None,
        expose: Sequence[Path] = (),
    ) -> SandboxResult:
        """Run the command; note which verifiers it asked for when it is a verifier."""
        if any(_VERIFIER_ENTRY in part for part in argv):
            try:
                requests = json.loads(stdin).get("requests", [])
                self.verifier_references += [str(r["verifier"]) for r in requests]
            except (ValueError, AttributeError, KeyError, TypeError):
                self.verifier_references.append("<unreadable request>")
        return self._inner.run(
            argv, limits=limits, workdir=workdir, stdin=stdin, extra_env=extra_env, expose=expose
        )


def _default_reference(name: str, seed: int, contract: EnvironmentContract,
                       item: Mapping[str, Any] | None = None) -> list[str]:
    from execution_loop.environments.registry import reference_solution

    return reference_solution(name, seed, contract, item=item)


class AdmissionProbe:
    """The admission evidence activity, bound to the task environments."""

    def __init__(
        self, *, environments: TaskEnvironments, reference: ReferenceLookup | None = None
    ) -> None:
        self._environments = environments
        self._reference = reference or _default_reference

    @activity.defn(name=PROBE_ADMISSION.name)
    def probe_admission(self, request: AdmissionProbeInput) -> AdmissionProbeEvidence:
        """Reset, recover and replay the reference solution; report what was observed."""
        task = self._environments.task(request.task_id, pending_ok=True)
        evidence = AdmissionProbeEvidence(
            task_id=task.task_id, environment_version_id=task.environment_version_id,
            environment=task.contract.task, seed=task.seed,
        )
        try:
            self._sandboxed_agent(task, evidence)
            return self._probe(task, request, evidence)
        except SandboxUnavailable as error:  # fail closed: no sandbox, no admission
            raise ApplicationError(f"task {task.task_id} is refused: {error}",
                                   type=type(error).__name__, non_retryable=True) from error

    def _sandboxed_agent(self, task: OpenedTask, evidence: AdmissionProbeEvidence) -> None:
        """Refuse an agent contract that would run unisolated unasked; note it where asked.

        An environment that runs the policy's code chooses its sandbox when it opens, which
        the resets do next, with the same refusal.
        """
        if task.contract.agent is None:
            return
        sandbox = default_sandbox(allow_unisolated=task.contract.allows_unisolated)
        record = describe(sandbox)
        if record["backend"] == "local":
            evidence.notes.append(f"the agent program will run unisolated: {record['why']}")

    def _probe(self, task: OpenedTask, request: AdmissionProbeInput,
               evidence: AdmissionProbeEvidence) -> AdmissionProbeEvidence:
        actions = (self._reference(task.contract.task, task.seed, task.contract)
                   if task.item is None else
                   self._reference(task.contract.task, task.seed, task.contract, item=task.item))
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
        activity.heartbeat("reward hacks")
        evidence.reward_hacks = probe_reward_hacks(task.open, task.seed, item=task.item)
        self._describe(task, evidence)
        return evidence

    def _describe(self, task: OpenedTask, evidence: AdmissionProbeEvidence) -> None:
        """The task's content digest and tags (governance records them with the evidence)."""
        from execution_loop.environments.registry import describe_task

        try:
            content = describe_task(task.contract, task.seed, task.item, factory=task.factory)
        except EnvironmentUnavailable:
            raise
        except Exception as error:  # the probe's other answers still stand; say why not
            evidence.notes.append(f"the task could not be described: "
                                  f"{type(error).__name__}: {error}"[:500])
            return
        evidence.content_digest = content.digest
        evidence.tags = {str(k): str(v) for k, v in content.tags.items()}

    def _resets(
        self, task: OpenedTask, actions: list[str], count: int, evidence: AdmissionProbeEvidence
    ) -> None:
        env = task.open()
        try:
            for index in range(count):
                if index and actions:
                    env.step(actions[0])  # change the state, so the next reset must recover
                started = time.perf_counter()
                reset_task(env, task.seed, task.item)
                evidence.reset_seconds.append(time.perf_counter() - started)
                evidence.reset_fingerprints.append(env.state_fingerprint())
        finally:
            env.close()

    def _reference_run(
        self, task: OpenedTask, actions: list[str], sandbox: RecordingSandbox
    ) -> tuple[bool, float]:
        env = task.open(sandbox=sandbox)
        try:
            reset_task(env, task.seed, task.item)
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
