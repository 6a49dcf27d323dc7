"""Running a loop's workers as a service: connect, poll until SIGTERM or SIGINT, stop gracefully.

Each loop's ``worker.py`` builds its workers (its one wiring point) and hands the builder to
``serve``; connecting, the signal handling, the /metrics server (``triloop.metrics``) with
the backlog of each polled task queue, and the graceful shutdown are the same for all.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import Callable, Coroutine, Sequence
from contextlib import AsyncExitStack
from datetime import timedelta
from typing import Any

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.worker import Worker

from triloop.config import LoopName, Settings
from triloop.metrics import TASK_QUEUE_BACKLOG, MetricsServer, start_metrics_server
from triloop.temporal import connect

log = logging.getLogger("triloop.worker")
# How often each worker asks the server for its queues' backlog (seconds): a scrape
# interval's worth, so /metrics is never older than about one scrape.
BACKLOG_SAMPLE_S = 15.0


def worker_identity(loop: LoopName) -> str:
    """How a loop's worker process appears in workflow histories."""
    return f"{loop}-worker@{socket.gethostname()}"


async def serve(
    settings: Settings, loop: LoopName, build: Callable[[Client], Sequence[Worker]],
    background: Callable[[Client], Coroutine[Any, Any, None]] | None = None,
) -> None:
    """Poll ``build``'s workers as ``loop``'s service until SIGTERM or SIGINT.

    Then no new task is taken and running ones get each worker's graceful shutdown time
    to finish (a cancelled one is retried elsewhere). ``background`` (governance's
    interruption watch) runs beside the workers and is cancelled when they stop.
    """
    client = await connect(settings, identity=worker_identity(loop), service=loop)
    workers = build(client)
    metrics = open_metrics_server(settings, loop)
    sampler = asyncio.create_task(sample_backlogs(client, [w.task_queue for w in workers]))
    watcher = asyncio.create_task(background(client)) if background is not None else None
    stop = asyncio.Event()
    running = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        running.add_signal_handler(sig, stop.set)
    try:
        async with AsyncExitStack() as stack:
            for worker in workers:
                await stack.enter_async_context(worker)  # leaving it calls worker.shutdown()
            log.info("polling %s as %s", [w.task_queue for w in workers], client.identity)
            await stop.wait()
            log.info("shutting down: no new tasks, waiting for running ones")
    finally:
        sampler.cancel()
        if metrics is not None:
            metrics.close()
        if watcher is not None:
            watcher.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT):
            running.remove_signal_handler(sig)
    log.info("stopped")


def open_metrics_server(settings: Settings, loop: LoopName) -> MetricsServer | None:
    """The loop worker's /metrics server on ``metrics_port_<loop>``, or None when that is 0."""
    port = settings.metrics_port(loop)
    if port == 0:
        return None
    server = start_metrics_server(settings.metrics_host, port,
                                  token=settings.metrics_scrape_token(),
                                  setting=f"TRILOOP_METRICS_PORT_{loop.upper()}")
    log.info("metrics at %s", server.url)
    return server


_QUEUE_TYPES = (("workflow", TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW),
                ("activity", TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY),
                ("nexus", TaskQueueType.TASK_QUEUE_TYPE_NEXUS))


async def sample_backlogs(client: Client, queues: Sequence[str], *,
                          every_s: float = BACKLOG_SAMPLE_S) -> None:
    """Every ``every_s``: how many tasks wait on each polled queue, as the server counts them.

    A refused or failed describe is logged once per queue and type, its series is dropped
    until the server answers again, and sampling goes on: the backlog is an operator's view,
    never a reason to stop polling.
    """
    failing: set[tuple[str, str]] = set()
    while True:
        for queue in queues:
            for kind, queue_type in _QUEUE_TYPES:
                try:
                    described = await client.workflow_service.describe_task_queue(
                        DescribeTaskQueueRequest(
                            namespace=client.namespace, task_queue=TaskQueue(name=queue),
                            task_queue_type=queue_type, report_stats=True),
                        timeout=timedelta(seconds=5))
                except RPCError as exc:
                    if (queue, kind) not in failing:
                        log.warning("backlog of %s (%s) not sampled: %s", queue, kind, exc)
                        # No stale number: the series goes until the server answers again.
                        TASK_QUEUE_BACKLOG.remove(client.namespace, queue, kind)
                    failing.add((queue, kind))
                    continue
                failing.discard((queue, kind))
                TASK_QUEUE_BACKLOG.labels(namespace=client.namespace, task_queue=queue,
                                          type=kind).set(described.stats.approximate_backlog_count)
        await asyncio.sleep(every_s)
