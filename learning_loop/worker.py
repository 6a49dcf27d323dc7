"""The learning loop's worker: the one place that builds its adapters.

``python -m learning_loop.worker`` reads ``TRILOOP_*`` settings, connects to Temporal as
``learning-worker@<host>`` and polls two queues:

- ``learning``: ``TrainingRunWorkflow`` and the light activities (run checks, status,
  person's controls, proposals). Needs no torch at all.
- ``learning-gpu``: the policy update and base-model registration (torch, CUDA when
  present), one update at a time per process.

``--queue learning`` or ``--queue learning-gpu`` polls one of them only, so GPU nodes can
run update workers while a small machine runs the workflows. Database access uses the
``triloop_learning`` role; every write asks OPA first. SIGTERM (or Ctrl-C) stops polling
and gives running activities ``GRACEFUL_SHUTDOWN`` to finish; a killed update is retried
elsewhere and resumes from its last checkpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from temporalio.client import Client
from temporalio.worker import Worker

from learning_loop.activities.run_state import RunActivities
from learning_loop.workflows import ModelImportWorkflow, TrainingRunWorkflow
from triloop.config import Settings, get_settings
from triloop.db import role_engine
from triloop.wiring import build_authorizer
from triloop.worker_serve import serve, worker_identity
from triloop.workflow_api import LEARNING_GPU_QUEUE, LEARNING_QUEUE

GRACEFUL_SHUTDOWN = timedelta(seconds=30)
QUEUES = (LEARNING_QUEUE, LEARNING_GPU_QUEUE)


def build_workflow_worker(client: Client, settings: Settings) -> Worker:
    """The ``learning`` queue: the run workflow and its light activities (no torch)."""
    run_state = RunActivities(
        engine=role_engine(settings, "learning"),
        authorizer=build_authorizer(settings, "learning"),
    )
    return Worker(
        client,
        task_queue=settings.task_queue(LEARNING_QUEUE),
        workflows=[TrainingRunWorkflow, ModelImportWorkflow],
        activities=[run_state.validate_run, run_state.set_run_status, run_state.control_run,
                    run_state.propose_checkpoint, run_state.record_mitigation],
        activity_executor=ThreadPoolExecutor(max_workers=8, thread_name_prefix="learning"),
        graceful_shutdown_timeout=GRACEFUL_SHUTDOWN,
        identity=worker_identity("learning"),
    )


def build_update_worker(client: Client, settings: Settings) -> Worker:
    """The ``learning-gpu`` queue: policy updates, base registration and imports (torch)."""
    from learning_loop.activities.bases import BaseActivities
    from learning_loop.activities.update import UpdateActivities
    from triloop.artifact_backends import open_shared_store

    engine, store = role_engine(settings, "learning"), open_shared_store(settings)
    authorizer = build_authorizer(settings, "learning")
    updates = UpdateActivities(
        engine=engine, authorizer=authorizer, artifact_dir=settings.artifacts,
        store=store, cache_dir=settings.artifact_cache, home=settings.home,
        torch_threads=settings.torch_threads,
    )
    bases = BaseActivities(engine=engine, authorizer=authorizer,
                           artifact_dir=settings.artifacts, store=store)
    return Worker(
        client,
        task_queue=settings.task_queue(LEARNING_GPU_QUEUE),
        activities=[updates.update_policy, bases.register_base_checkpoint, bases.import_model],
        activity_executor=ThreadPoolExecutor(max_workers=2, thread_name_prefix="learning-gpu"),
        # One update at a time: it owns the accelerator (a registration or an import may run
        # beside it).
        max_concurrent_activities=2,
        graceful_shutdown_timeout=GRACEFUL_SHUTDOWN,
        identity=worker_identity("learning"),
    )


def build_worker(
    client: Client, settings: Settings, *, queues: tuple[str, ...] = QUEUES
) -> list[Worker]:
    """One worker per requested queue (prefixed by settings); run them together."""
    unknown = set(queues) - set(QUEUES)
    if unknown:
        raise ValueError(f"unknown learning queue(s) {sorted(unknown)}; choose from {QUEUES}")
    builders = {LEARNING_QUEUE: build_workflow_worker, LEARNING_GPU_QUEUE: build_update_worker}
    return [builders[q](client, settings) for q in queues]


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m learning_loop.worker``."""
    parser = argparse.ArgumentParser(prog="python -m learning_loop.worker",
                                     description="Poll the learning loop's task queues.")
    parser.add_argument("--queue", action="append", choices=QUEUES, dest="queues",
                        help="poll only this queue (repeatable); default: both")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = get_settings()
    queues = tuple(args.queues or QUEUES)
    asyncio.run(serve(settings, "learning",
                      lambda client: build_worker(client, settings, queues=queues)))


if __name__ == "__main__":
    main()
