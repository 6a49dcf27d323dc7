"""Decode progress: how an episode hears, token by token, that its turn is moving.

A turn of a real model on a busy CPU can take longer than an activity's heartbeat timeout,
so "a turn finished" is too coarse a sign of life. The episode that asks for a turn sets a
``DecodeWatcher`` around its ``generate`` call (``watching_decode``); the in-process
backend (``TorchPolicyClient`` and its ``BatchingEngine``) finds it and reports each token
of the request, and, while the request waits for a micro-batch, whether the engine is
advancing anybody's sequences. The engine also reads the watcher's ``owner`` to admit
owners round-robin when more requests wait than one micro-batch holds.

Why a context variable rather than a ``generate`` argument: the policy interface is shared
with remote backends, the agent gateway and test stand-ins, none of which can report
tokens; progress is an optional side channel from the episode's call stack to the one
backend that can. A backend that ignores it is as before: its turn must end within the
heartbeat timeout.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol

__all__ = ["DecodeWatcher", "current_watcher", "watching_decode"]


class DecodeWatcher(Protocol):
    """Who is told about one request's progress through the engine."""

    @property
    def owner(self) -> str:
        """Whose request it is (a run or a batch): the engine shares micro-batches by owner."""
        ...

    def decoded(self, tokens: int) -> None:
        """The request's sequence advanced; ``tokens`` so far. Called on the engine's
        thread, once per token: it must be quick and must not raise."""
        ...

    def waiting(self, engine_advanced: bool) -> None:
        """The request still waits for a micro-batch (called on the caller's thread every
        ``QUEUED_POLL_S``); ``engine_advanced``: the engine decoded tokens for others since
        the last call. May raise (a cancelled episode) to withdraw the request."""
        ...


_WATCHER: ContextVar[DecodeWatcher | None] = ContextVar("decode_watcher", default=None)


@contextmanager
def watching_decode(watcher: DecodeWatcher) -> Iterator[None]:
    """Report the progress of every request made in this block to ``watcher``."""
    token = _WATCHER.set(watcher)
    try:
        yield
    finally:
        _WATCHER.reset(token)


def current_watcher() -> DecodeWatcher | None:
    """The watcher of the request being made now, if the caller set one."""
    return _WATCHER.get()
