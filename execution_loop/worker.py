"""The execution loop's worker: the one place that builds its adapters.

``python -m execution_loop.worker`` reads ``TRILOOP_*`` settings, connects to
Temporal with the execution service's token in the execution namespace, and polls the
``execution`` queue: the rollout and admission-probe workflows, the episode activities,
and the Nexus operations through which learning and governance ask for batches. Database access
uses the ``triloop_execution`` role; every write asks OPA first. SIGTERM (or
Ctrl-C) stops polling and lets running episodes finish for up to
``GRACEFUL_SHUTDOWN`` before they are cancelled and retried elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from temporalio.client import Client
from temporalio.worker import Worker

from execution_loop.activities import RolloutActivities, activities_of
from execution_loop.admission_probe import AdmissionProbe
from execution_loop.environments.registry import ensure_plugins_load
from execution_loop.episode_slots import EpisodeSlots
from execution_loop.group_runner import EpisodeGroupRunner
from execution_loop.nexus_handlers import ExecutionNexusHandlers
from execution_loop.serving import (
    EnvironmentLookup,
    PolicyCache,
    PolicyFactory,
    TaskEnvironments,
    backend_factory,
    serving_refusals,
)
from execution_loop.store import EXECUTION
from execution_loop.task_description import TaskDescriber
from execution_loop.workflows import AdmissionProbeWorkflow, DescribeTasksWorkflow, RolloutWorkflow
from triloop.artifact_backends import open_shared_store, open_store
from triloop.config import Settings, get_settings
from triloop.db import role_engine
from triloop.faults import read_serving_faults
from triloop.metrics import watch_episode_queue
from triloop.nexus_caller import NexusCallerCheck
from triloop.wiring import build_authorizer
from triloop.worker_serve import serve, worker_identity
from triloop.workflow_api import EXECUTION_QUEUE

GRACEFUL_SHUTDOWN = timedelta(seconds=30)
# A cancel (the batch's run was cancelled) reaches a running episode activity in the answer
# to its next heartbeat; the SDK would send one only every 0.8 heartbeat timeouts (48 s of
# a 60 s timeout), so a cancelled run's episodes would play on for that long.
HEARTBEAT_THROTTLE = timedelta(seconds=2)
DEFAULT_CONCURRENT_EPISODES = 16


def build_worker(
    client: Client,
    settings: Settings,
    *,
    policy_factory: PolicyFactory | None = None,
    environment_lookup: EnvironmentLookup | None = None,
    max_concurrent_episodes: int = DEFAULT_CONCURRENT_EPISODES,
    episode_slots: EpisodeSlots | None = None,
) -> Worker:
    """A worker on the (prefixed) execution queue; tests inject a policy, environments, or
    the episode slots they watch."""
    engine = role_engine(settings, "execution")
    authorizer = build_authorizer(settings, "execution")
    policies = PolicyCache(
        engine=engine,
        factory=policy_factory or backend_factory(settings, audit=serving_refusals(engine)),
        home=settings.home,
        store=open_shared_store(settings),
    )
    # Uploaded fixtures (an agent program, a repository) come from the artifact store.
    environments = TaskEnvironments(engine=engine, lookup=environment_lookup,
                                    fixtures=open_store(settings),
                                    cache=settings.artifact_cache / "fixtures")
    rollout = RolloutActivities(
        engine=engine, authorizer=authorizer, policies=policies, environments=environments,
        serving_faults=lambda: read_serving_faults(settings.home),
        # Black-box agents get default_sandbox() per episode: bubblewrap (reaching only the
        # gateway), unisolated only where the stack or their contract says so.
    )
    # A group activity plays its episodes on these slots: at most max_concurrent_episodes
    # at once on this worker, whatever the groups, shared fairly between runs.
    slots = episode_slots or EpisodeSlots(max_concurrent_episodes)
    groups = EpisodeGroupRunner(rollout=rollout, engine=engine, authorizer=authorizer,
                                episodes=slots)
    # The worker's own queue on /metrics: episodes playing, and episodes waiting for a slot.
    watch_episode_queue(lambda: sum(slots.held().values()),
                        lambda: sum(slots.waiting().values()))
    probe = AdmissionProbe(environments=environments)
    describer = TaskDescriber(environments=environments, store=open_store(settings))
    # Episodes are synchronous (torch, subprocess sandboxes): one thread each.
    executor = ThreadPoolExecutor(
        max_workers=max_concurrent_episodes + 2, thread_name_prefix="episode"
    )
    return Worker(
        client,
        task_queue=settings.task_queue(EXECUTION_QUEUE),
        workflows=[RolloutWorkflow, AdmissionProbeWorkflow, DescribeTasksWorkflow],
        activities=[*activities_of(rollout), groups.run_group, probe.probe_admission,
                    describer.describe_tasks],
        nexus_service_handlers=[ExecutionNexusHandlers(
            NexusCallerCheck(settings, server=EXECUTION, authorizer=authorizer), engine)],
        activity_executor=executor,
        max_concurrent_activities=max_concurrent_episodes,
        graceful_shutdown_timeout=GRACEFUL_SHUTDOWN,
        max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
        default_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
        identity=worker_identity("execution"),
    )


def main() -> None:
    """Entry point of ``python -m execution_loop.worker``."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    # A broken installed environment, or one taking a built-in's name, stops the worker
    # here with its name, rather than failing (or being shadowed) episode by episode.
    ensure_plugins_load()
    settings = get_settings()
    asyncio.run(serve(settings, "execution", lambda client: [build_worker(client, settings)]))


if __name__ == "__main__":
    main()
