"""What one request may cost: a body-size limit, and CPU-heavy checks off the event loop.

The event loop serves every request of the process, so nothing a client sends may
hold it: bodies over ``TRILOOP_MAX_BODY_BYTES`` are refused (413) before they are
read in full, and validation that can take CPU time (a run config) runs in a
small thread pool of its own, bounded by ``TRILOOP_VALIDATION_TIMEOUT_S``. A
thread cannot be killed, so the size limits are what bound the work; the time
limit bounds how long a caller, and the pool's queue, waits for it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from web.problems import ProblemError, problem_response

T = TypeVar("T")


def too_large(limit: int, size: int | None = None) -> ProblemError:
    """413 naming the limit and the setting that raises it."""
    got = f"{size} bytes" if size is not None else f"more than {limit} bytes"
    return ProblemError(
        413, "Content too large",
        f"the request body is {got}; this service reads at most {limit} bytes "
        "(TRILOOP_MAX_BODY_BYTES)",
    )


class BodySizeLimit:
    """ASGI middleware: refuse a body over ``limit`` bytes with a 413 problem.

    A declared ``Content-Length`` over the limit is refused before anything is read;
    a body without one (chunked) is read up to the limit and then refused.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check the declared length, or buffer up to the limit, then call the app."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None:
            if declared > self.limit:
                await problem_response(too_large(self.limit, declared).problem())(
                    scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.limit:
                await problem_response(too_large(self.limit).problem())(scope, receive, send)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class ValidationPool:
    """A few threads for CPU-heavy validation, each call bounded in time."""

    def __init__(self, *, workers: int, timeout_s: float) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="validation")
        self.timeout_s = timeout_s

    async def run(self, what: str, fn: Callable[..., T], /, **kwargs: Any) -> T:
        """``fn(**kwargs)`` in the pool; 422 if it runs too long, 503 if it never started."""
        started = threading.Event()

        def call() -> T:
            started.set()
            return fn(**kwargs)

        future = asyncio.get_running_loop().run_in_executor(self._pool, partial(call))
        try:
            return await asyncio.wait_for(future, self.timeout_s)
        except TimeoutError as exc:
            if not started.is_set():
                raise ProblemError(
                    503, "Validation busy",
                    f"{what} could not be validated within {self.timeout_s:g} s because other "
                    "requests are being validated; try again shortly",
                ) from exc
            raise ProblemError(
                422, "Invalid input",
                f"validating {what} took longer than {self.timeout_s:g} s "
                "(TRILOOP_VALIDATION_TIMEOUT_S); make it smaller or simpler",
            ) from exc
