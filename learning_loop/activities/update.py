"""Activities on ``learning-gpu``: one policy update per iteration (bases: ``bases.py``).

The update is idempotent per (run, iteration): if the iteration's ``training_step`` row
exists, the stored result is returned and nothing trains. Otherwise the parent checkpoint
(weights, optimizer, scheduler, RNG) is loaded (or kept in memory from the update that
saved it, on this worker), the rollout batches are read from the
database, the update runs in a worker thread while the activity heartbeats, and the
checkpoint is saved; then, after ``authorize()``, one transaction writes the checkpoint
row, the training step, ``iterations_done`` and the alarms' audit events. Last, retention
(``learning_loop.retention``) deletes the files of the run's checkpoints the database
says may go. A parent or base whose files were pruned is a ``CheckpointPruned`` error
naming the rule, before anything is read.

Heartbeat details say how far an attempt got. A retry after the checkpoint was saved
(heartbeat stage ``saved``) reuses it instead of training again.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from learning_loop.activities.bases import checkpoint_uri
from learning_loop.advantages import AdvantageInputError
from learning_loop.batch import InvalidSampleError
from learning_loop.batch_metrics import merge_series, tag_series
from learning_loop.checkpoints import (
    CheckpointError,
    CheckpointRef,
    serving_hashes,
)
from learning_loop.contracts import (
    CHECKPOINT_BROKEN,
    CHECKPOINT_PRUNED,
    INVALID_TRAINING_DATA,
    RANK_FAILED,
    UPDATE_POLICY,
    AlarmReport,
    UpdateInput,
    UpdateResult,
)
from learning_loop.iteration import (
    NoTrainableData,
    WarmLearner,
    train_iteration,
)
from learning_loop.iteration_records import alarm_record, saved_iteration, stability_history
from learning_loop.lora import adapter_record
from learning_loop.mitigation import with_mitigations
from learning_loop.rank_launch import RankFailed
from learning_loop.retention import CheckpointFiles, prune_run
from learning_loop.stability import StabilityInputError
from learning_loop.store import (
    get_checkpoint,
    get_training_step,
    record_iteration,
    stability_rows,
)
from learning_loop.trajectory_reader import load_rollout_data
from learning_loop.update import UpdateError
from triloop.artifacts import ArtifactNotFound, ArtifactStore
from triloop.models import Checkpoint, TrainingStep
from triloop.policy import Actor, Authorizer, PolicyDenied, Resource
from triloop.retention import CheckpointPruned, RetentionPolicy, refuse_pruned
from triloop.weights import UnsupportedArtifactUri, checkpoint_dir

LEARNING = Actor(service="learning")
_BAD_DATA = (InvalidSampleError, NoTrainableData, AdvantageInputError, UpdateError,
             StabilityInputError)


class UpdateCancelled(RuntimeError):
    """The workflow cancelled the update before its results were stored."""


@dataclass
class _Progress:
    """What the training thread reports; the activity heartbeats it."""

    stage: str = "starting"
    checkpoint_id: str | None = None

    def details(self) -> dict[str, Any]:
        return {"stage": self.stage, "checkpoint_id": self.checkpoint_id}

    @classmethod
    def resumed(cls, details: Sequence[Any]) -> _Progress:
        """How far an earlier attempt got, from its last heartbeat (nothing: from scratch)."""
        last = details[0] if details and isinstance(details[0], dict) else {}
        checkpoint_id = last.get("checkpoint_id")
        return cls(stage=str(last.get("stage") or "starting"),
                   checkpoint_id=checkpoint_id if isinstance(checkpoint_id, str) else None)


@dataclass(frozen=True)
class TrainedIteration:
    """An iteration trained but not yet stored: its checkpoint and what is written for it."""

    checkpoint_id: str  # the parent's id when the weights did not change
    path: Path  # the checkpoint's directory on this worker
    step_columns: dict[str, Any]  # the ``training_step`` columns (records.step_columns)
    alarms: list[dict[str, Any]]  # each alarm as audited (records.alarm_record)


class UpdateActivities:
    """Torch activities, bound to the learning role's engine, the authorizer and artifacts."""

    def __init__(
        self, *, engine: Engine, authorizer: Authorizer, artifact_dir: Path,
        store: ArtifactStore | None = None, cache_dir: Path | None = None,
        home: Path | None = None, torch_threads: int | None = None,
        retention: RetentionPolicy | None = None,
    ) -> None:
        self._engine = engine
        self._authorizer = authorizer
        self._artifact_dir = artifact_dir
        # Relative artifact paths are relative to home, as the execution loop reads them.
        self._home = home or artifact_dir.parent
        # With a shared store, checkpoints are published there (their URI names the store)
        # and read back through a verified local cache; without one they stay file:// here.
        self._shared_store = store
        self._cache_dir = cache_dir or artifact_dir / "cache"
        self._executor = learner_executor(torch_threads)
        # Retention after each stored iteration (None: keep every checkpoint's files).
        self._retention = retention
        self._files = CheckpointFiles(artifact_dir=artifact_dir, store=store,
                                      cache_dir=self._cache_dir)
        # The learner the last update left in memory (only the learner thread touches it):
        # the run's next update starts from it instead of reading its checkpoint back.
        self._warm: WarmLearner | None = None

    @activity.defn(name=UPDATE_POLICY.name)
    async def update_policy(self, request: UpdateInput) -> UpdateResult:
        """Train one iteration (once), heartbeating while the training thread works."""
        resume = _Progress.resumed(activity.info().heartbeat_details)
        progress, abort = _Progress(), threading.Event()
        timeout = activity.info().heartbeat_timeout
        interval = max(0.5, timeout.total_seconds() / 4) if timeout else 10.0
        job = asyncio.get_running_loop().run_in_executor(
            self._executor, self._update, request, progress, abort, resume
        )
        try:
            while True:
                done, _ = await asyncio.wait({job}, timeout=interval)
                if done:
                    break
                activity.heartbeat(progress.details())
        except asyncio.CancelledError:
            abort.set()  # the thread stores nothing once it sees this
            raise
        try:
            return job.result()
        except _BAD_DATA as exc:
            raise ApplicationError(f"{type(exc).__name__}: {exc}", type=INVALID_TRAINING_DATA,
                                   non_retryable=True) from exc
        except RankFailed as exc:
            # A rank that raised fails the same way again; one that died (killed, out of
            # memory, a lost peer, the time limit) may not, so that one is retried.
            raise ApplicationError(str(exc), type=RANK_FAILED,
                                   non_retryable=exc.python_error) from exc
        except CheckpointPruned as exc:
            raise ApplicationError(str(exc), type=CHECKPOINT_PRUNED, non_retryable=True) from exc
        except (CheckpointError, PolicyDenied) as exc:
            kind = CHECKPOINT_BROKEN if isinstance(exc, CheckpointError) else "PolicyDenied"
            raise ApplicationError(str(exc), type=kind, non_retryable=True) from exc

    def _update(
        self, request: UpdateInput, progress: _Progress, abort: threading.Event,
        resume: _Progress,
    ) -> UpdateResult:
        stored = get_training_step(engine=self._engine, run_id=request.run_id,
                                   iteration=request.iteration)
        if stored is not None:
            self._prune(request, progress)  # an attempt that stored may not have pruned
            return result_of(stored, already_done=True)
        parent = get_checkpoint(engine=self._engine, checkpoint_id=request.parent_checkpoint_id)
        if parent is None:
            raise CheckpointError(f"parent checkpoint {request.parent_checkpoint_id} has no row")
        parent_dir = self._local_dir(parent, wanted_for="trained from (the update's parent)")
        trained = self._saved(resume, request)
        if trained is None:
            trained = self._train(request, parent, parent_dir, progress)
        if abort.is_set():
            raise UpdateCancelled(f"update of iteration {request.iteration} was cancelled")
        result = self._store(request, parent, trained)
        self._prune(request, progress)
        return result

    def _prune(self, request: UpdateInput, progress: _Progress) -> None:
        """Retention once the iteration is stored: older iterations give up their files.

        A failure here (a refusal, the database or the store) costs disk, not the
        iteration: it is logged, and the next update's pass (which lists every pruned
        checkpoint again) finishes the work.
        """
        keep = (self._retention.keep_for(request.config.checkpoints.keep_last)
                if self._retention is not None else None)
        if keep is None:
            return
        progress.stage = "pruning"
        retain = [request.parent_checkpoint_id, *request.retain_checkpoint_ids]
        try:
            self._authorizer.authorize(LEARNING, "delete", Resource(
                "checkpoint", id=f"{request.run_id}:retention",
                attrs={"run_id": request.run_id, "keep_last": keep}))
            report = prune_run(engine=self._engine, files=self._files, run_id=request.run_id,
                               keep_last=keep, retain=retain)
        except (PolicyDenied, SQLAlchemyError, OSError, ArtifactNotFound,
                ConnectionError) as exc:
            activity.logger.warning("iteration %s: retention did not finish (%s: %s); the next"
                                    " update retries it", request.iteration,
                                    type(exc).__name__, exc)
            return
        if report.newly_pruned:
            activity.logger.info(
                "iteration %s: pruned %d checkpoint(s) by keep_last=%d, %d bytes freed",
                request.iteration, len(report.newly_pruned), report.keep_last,
                report.freed_bytes)

    def _publish(self, directory: Path) -> str:
        return checkpoint_uri(self._shared_store, directory)

    def _local_dir(self, checkpoint: Checkpoint, *, wanted_for: str) -> Path:
        refuse_pruned(checkpoint, wanted_for=wanted_for)
        try:
            return checkpoint_dir(checkpoint.artifact_uri, home=self._home,
                                  store=self._shared_store, cache=self._cache_dir,
                                  checkpoint_id=checkpoint.id)
        except UnsupportedArtifactUri as exc:
            raise CheckpointError(str(exc)) from exc

    def _take_warm(self, parent_id: str) -> WarmLearner | None:
        """The learner in memory if it is the parent's; either way this worker lets go of
        it, so that another run's update never holds two models at once."""
        warm, self._warm = self._warm, None
        return warm if warm is not None and warm.checkpoint_id == parent_id else None

    def _saved(self, resume: _Progress, request: UpdateInput) -> TrainedIteration | None:
        """A previous attempt's saved checkpoint for this iteration, if it got that far."""
        checkpoint_id = resume.checkpoint_id
        if resume.stage != "saved" or checkpoint_id is None:
            return None
        path = self._artifact_dir / "checkpoints" / checkpoint_id
        saved = saved_iteration(path, run_id=request.run_id, iteration=request.iteration)
        if saved is None:
            return None
        activity.logger.info("iteration %s: reusing checkpoint %s saved by an earlier attempt",
                             request.iteration, checkpoint_id)
        return TrainedIteration(checkpoint_id, path, dict(saved["training_step"]),
                                list(saved.get("alarms") or []))

    def _train(
        self, request: UpdateInput, parent: Checkpoint, parent_dir: Path, progress: _Progress
    ) -> TrainedIteration:
        config = with_mitigations(request.config, entropy_coef_bonus=request.entropy_coef_bonus,
                                  learning_rate_scale=request.learning_rate_scale)
        data = load_rollout_data(engine=self._engine, run_id=request.run_id,
                                 batch_ids=request.batch_ids,
                                 task_environments=request.task_environments,
                                 truncated_episodes=config.asynchrony.truncated_episodes,
                                 held_groups=request.held_group_ids,
                                 carried_groups=request.carried_group_ids,
                                 zero_task_reward=config.advantage.zero_task_reward)
        history = stability_history(stability_rows(
            engine=self._engine, run_id=request.run_id, before=request.iteration))
        reference_dir, base_ref = None, None
        if config.objective.kl_coef > 0 or config.update.lora is not None:
            base = get_checkpoint(engine=self._engine, checkpoint_id=request.base_checkpoint_id)
            if base is None:
                raise CheckpointError(f"base checkpoint {request.base_checkpoint_id} has no row")
            reference_dir = self._local_dir(base, wanted_for="the run's KL reference")
            # LoRA: the adapters sit on the run's base; its id is part of theirs.
            base_ref = CheckpointRef(base.id, reference_dir)

        def stage(name: str) -> None:
            progress.stage = name

        outcome = train_iteration(
            artifact_dir=self._artifact_dir,
            parent=CheckpointRef(parent.id, parent_dir),
            resume_optimizer=parent.run_id == request.run_id, reference_dir=reference_dir,
            config=config, data=data, iteration=request.iteration, history=history,
            data_cursor={"run_id": request.run_id, "iteration": request.iteration,
                         "batch_ids": list(request.batch_ids),
                         "next_iteration": request.iteration + 1},
            on_stage=stage, series=merge_series(request.series,
                                                tag_series(data.returns, request.task_tags)),
            warm=self._take_warm(parent.id),
            base=base_ref,
        )
        self._warm = outcome.learner
        if outcome.weights_changed:
            progress.stage, progress.checkpoint_id = "saved", outcome.checkpoint.id
        return TrainedIteration(outcome.checkpoint.id, outcome.checkpoint.path,
                                outcome.step_columns, [alarm_record(a) for a in outcome.alarms])

    def _store(self, request: UpdateInput, parent: Checkpoint, trained: TrainedIteration
               ) -> UpdateResult:
        checkpoint_id = trained.checkpoint_id
        columns: dict[str, Any] = dict(trained.step_columns)
        columns["metrics"] = {**columns.get("metrics", {}),
                              "weights_changed": checkpoint_id != parent.id}
        batch = (columns.get("metrics") or {}).get("batch") or {}
        child = None
        if checkpoint_id != parent.id:  # identical weights keep the parent's id and row
            child = Checkpoint(
                id=checkpoint_id, parent_id=parent.id, run_id=request.run_id,
                base_model=request.base_checkpoint_id, iteration=request.iteration,
                environment_version_ids=list(request.environment_version_ids),
                data={"trajectory_batches": list(request.batch_ids),
                      "trajectories": batch.get("trajectories"),
                      "policy_versions": batch.get("policy_versions"),
                      **adapter_record(trained.path)},
                artifact_uri=self._publish(trained.path), created_by="learning",
                **asdict(serving_hashes(trained.path)),
            )
            self._authorizer.authorize(LEARNING, "create", Resource(
                "checkpoint", id=checkpoint_id,
                attrs={"run_id": request.run_id, "parent_id": parent.id}))
        self._authorizer.authorize(LEARNING, "create", Resource(
            "training_step", id=f"{request.run_id}:{request.iteration}",
            attrs={"run_id": request.run_id, "iteration": request.iteration}))
        self._authorizer.authorize(LEARNING, "update", Resource(
            "training_run", id=request.run_id, attrs={"iterations_done": request.iteration}))
        step = TrainingStep(run_id=request.run_id, iteration=request.iteration,
                            checkpoint_id=checkpoint_id, **columns)
        events = [{
            "actor": LEARNING.to_input(), "action": "stability_alarm",
            "resource": {"kind": "training_run", "id": request.run_id, "attrs": {}},
            "decision": "record", "payload": alarm,
        } for alarm in trained.alarms]
        stored = record_iteration(engine=self._engine, step=step, checkpoint=child,
                                  alarm_events=events)
        if not stored:  # a concurrent attempt won; report what it stored
            winner = get_training_step(engine=self._engine, run_id=request.run_id,
                                       iteration=request.iteration)
            assert winner is not None
            return result_of(winner, already_done=True)
        return result_of(step, already_done=False)


def learner_executor(torch_threads: int | None) -> ThreadPoolExecutor:
    """The learner's one thread (one update at a time per worker: the accelerator, or the
    CPU, is the bottleneck), with ``torch_threads`` intra-op threads when set.

    torch's intra-op pool is per calling thread, so the limit is set in the learner's own.
    """
    if torch_threads is None:
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="learner")
    if torch_threads < 1:
        raise ValueError(f"torch_threads must be at least 1, got {torch_threads}")
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="learner",
                              initializer=torch.set_num_threads, initargs=(torch_threads,))


def result_of(step: TrainingStep, *, already_done: bool) -> UpdateResult:
    """The workflow's view of a stored iteration."""
    metrics = step.metrics or {}
    update = metrics.get("update") or {}
    return UpdateResult(
        iteration=step.iteration, checkpoint_id=step.checkpoint_id or "",
        reward_mean=step.reward_mean, loss=step.loss, samples=int(update.get("samples") or 0),
        alarms=[AlarmReport(str(a["kind"]), str(a.get("message") or a["kind"]))
                for a in metrics.get("alarms") or []],
        already_done=already_done,
    )
