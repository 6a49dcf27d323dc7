"""A small OpenEnv environment served by openenv-core's own helpers (``create_fastapi_app``).

Count down to zero: the seed picks the start (3, 4 or 5); each ``down`` takes one off, any
other text is a wasted turn, and reaching zero ends the episode with reward 1.0. triloop
speaks to it through its ``openenv`` adapter (``docs/write-your-own-environment.md``,
section "OpenEnv"). Run: ``python countdown_server.py --port 8011``.
"""

from __future__ import annotations

import argparse
from typing import Any
from uuid import uuid4

from openenv.core.env_server import (
    Action,
    ConcurrencyConfig,
    Environment,
    Observation,
    State,
    create_fastapi_app,
)
from pydantic import Field


class CountdownAction(Action):
    """The model's text (at least one character)."""

    message: str = Field(min_length=1)


class CountdownObservation(Observation):
    """What is left to count down."""

    text: str = ""
    left: int = 0


class CountdownEnvironment(Environment):  # type: ignore[misc]
    """One session's count; OpenEnv makes one instance per WebSocket session."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # no state outside the instance

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self._left = 0

    def _observe(self, reward: float, done: bool) -> CountdownObservation:
        text = "done" if done else f"{self._left} left: write down"
        return CountdownObservation(text=text, left=self._left, reward=reward, done=done)

    def reset(self, seed: int | None = None, episode_id: str | None = None,
              **_kwargs: Any) -> CountdownObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self._left = 3 + (seed or 0) % 3
        return self._observe(0.0, False)

    def step(self, action: Action, **_kwargs: Any) -> CountdownObservation:
        assert isinstance(action, CountdownAction)
        self._state.step_count += 1
        if "down" in action.message.lower():
            self._left -= 1
        done = self._left <= 0
        return self._observe(1.0 if done else 0.0, done)

    @property
    def state(self) -> State:
        return self._state


# triloop holds one session per environment it has open and its verifier opens one per
# verdict: a training batch of 8 episodes needs 16 at once. Idle sessions end after 120 s.
app = create_fastapi_app(
    CountdownEnvironment, CountdownAction, CountdownObservation,
    concurrency_config=ConcurrencyConfig(max_concurrent_envs=64, session_timeout=120),
)


if __name__ == "__main__":
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8011)
    port = parser.parse_args().port
    # uvicorn's default WebSocket implementation here (websockets-sansio, uvicorn 0.54 with
    # websockets 17) stopped answering handshakes after the first round of 16 concurrent
    # sessions (3 rounds of reset, 3 steps, close: 20 s timeouts from round 2 on, every
    # time); its "websockets" implementation served 3 rounds of 32 in under 0.3 s each.
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", ws="websockets")
