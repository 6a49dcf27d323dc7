"""Running a loop's workers as a service: connect, poll until SIGTERM or SIGINT, stop gracefully.

Each loop's ``worker.py`` builds its workers (its one wiring point) and hands the builder to
``serve``; connecting, the signal handling and the graceful shutdown are the same for all.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import Callable, Coroutine, Sequence
from contextlib import AsyncExitStack
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from triloop.config import LoopName, Settings
from triloop.temporal import connect

log = logging.getLogger("triloop.worker")


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
        if watcher is not None:
            watcher.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT):
            running.remove_signal_handler(sig)
    log.info("stopped")
