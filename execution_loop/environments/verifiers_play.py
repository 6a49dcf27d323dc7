"""Play a ``verifiers`` environment one policy turn at a time, and score it with its rubric.

``verifiers`` (v1) runs an episode as ``Env.run(task, agents)``: a coroutine that asks its
agents for replies (``agent.run(task)`` for one segment, ``agent.interaction(task)`` and
``turn(message)`` for a conversation) and decides itself when the exchange is over. triloop's
episode runner asks the opposite way round (``reset`` gives an observation, ``step(action)``
the next). ``Play`` turns one into the other: the environment's coroutine runs on a private
event loop until it waits for a reply; that wait's messages are the observation, and the
next action resolves it. The seat triloop hands the environment is a stand-in for verifiers'
``Agent`` (the policy is triloop's, not a harness of verifiers'), so no model client,
runtime or interception server is started.

The same code runs in the worker (observations, not scored) and in the verifier process
(the recorded actions replayed against a freshly loaded environment, then the task's
``@vf.reward``/``@vf.metric`` functions and the environment's ``finalize``): the verdict
rests on what the environment computes, never on the observations the worker stored.

Imports ``verifiers`` at module load: only ``execution_loop.environments.verifiers``
imports it, lazily.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import verifiers.v1 as vf
from verifiers.v1.configs.agent import agent_config_fields
from verifiers.v1.dialects.chat import parse_message
from verifiers.v1.types import content_text


class VerifiersEnvironmentError(ValueError):
    """A verifiers environment, row or argument that cannot be played."""


@dataclass(frozen=True)
class PlaySpec:
    """Which verifiers environment: its taskset id, its config arguments, an env id."""

    taskset: str
    args: str = "{}"  # JSON object: the taskset config's fields
    env: str = ""  # an Env package to pair with the taskset ("" = the taskset's own)
    paths: tuple[str, ...] = ()  # folders put on sys.path first (a contract's fixtures)

    def arguments(self) -> dict[str, Any]:
        try:
            value = json.loads(self.args)
        except ValueError as exc:
            raise VerifiersEnvironmentError(f"initial_state.args is not JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise VerifiersEnvironmentError("initial_state.args must be a JSON object")
        return value


@cache
def load(spec: PlaySpec) -> vf.Env[Any]:
    """The environment, built by verifiers' own loader (once per process and spec)."""
    for folder in reversed(spec.paths):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    config = {"taskset": {**spec.arguments(), "id": spec.taskset}, "id": spec.env}
    try:
        return vf.load_environment(vf.resolve_env_config(config))
    except (ImportError, TypeError, AttributeError, ValueError) as exc:
        raise VerifiersEnvironmentError(
            f"verifiers environment {spec.taskset!r} failed to load: {type(exc).__name__}: {exc}"
        ) from exc


def seat_of(env: vf.Env[Any]) -> str:
    """The one agent seat the policy plays (an environment of several is refused)."""
    seats = sorted(agent_config_fields(env.config))
    if len(seats) != 1:
        raise VerifiersEnvironmentError(
            f"verifiers environment {env.config.env_id!r} declares agents {', '.join(seats)}; "
            "triloop plays exactly one seat (the policy)"
        )
    return str(seats[0])


def row_of(task: vf.Task[Any, Any, Any]) -> dict[str, Any]:
    """A task's row as a JSON item: its data without the load position or defaults."""
    data = task.data.model_dump(mode="json", exclude_defaults=True)
    data.pop("idx", None)
    return dict(data)


def rows(spec: PlaySpec, count: int | None = None) -> list[dict[str, Any]]:
    """The first ``count`` rows of the taskset (all of a finite one when None)."""
    taskset = load(spec).taskset
    if count is None and not taskset.bounded:
        raise VerifiersEnvironmentError(f"taskset {spec.taskset!r} is infinite: give a count")
    view = taskset.take(count) if count is not None else taskset
    return [row_of(task) for task in view]


def task_for(spec: PlaySpec, seed: int, item: Mapping[str, Any] | None) -> vf.Task[Any, Any, Any]:
    """The task an item names (one row), or the seed's row of the taskset without one."""
    env = load(spec)
    task_cls = type(env.taskset).task_type()
    if item is None:
        if seed < 0:
            raise VerifiersEnvironmentError(f"seed {seed} names no row (rows start at 0)")
        found = next(iter(env.taskset.skip(seed).take(1)), None)
        if found is None:
            raise VerifiersEnvironmentError(f"taskset {spec.taskset!r} has no row {seed}")
        return found
    try:
        data = task_cls.data_type().model_validate(dict(item))
    except ValueError as exc:
        raise VerifiersEnvironmentError(
            f"item is not a row of {spec.taskset!r} ({task_cls.data_type().__name__}): {exc}"
        ) from exc
    return task_cls(data, env.taskset.config.task)


@dataclass
class Scored:
    """What the rubric said about the policy's trace."""

    reward: float
    rewards: dict[str, float]
    metrics: dict[str, float]
    stop_condition: str | None
    turns: int
    last_reply: str


@dataclass
class _Ask:
    """The environment waiting on the policy: the messages it sent, the reply to come."""

    text: str
    reply: asyncio.Future[str]


def _text(messages: Sequence[vf.Message]) -> str:
    return "\n\n".join(t for m in messages if (t := content_text(m.content)))


@dataclass
class _Seat:
    """The stand-in for verifiers' ``Agent`` in the one seat: replies come from triloop."""

    play: Play
    name: str
    config: vf.AgentConfig
    trainable: bool = True
    traces: list[vf.Trace[Any, Any, Any]] = field(default_factory=list)

    async def run(self, task: vf.Task[Any, Any, Any], **_: Any) -> vf.Trace[Any, Any, Any]:
        """One segment: the task's prompt, one reply."""
        async with self.interaction(task) as conversation:
            segment = await conversation.turn()
            if not segment.terminated:
                conversation.trace.stop("agent_completed")
        return conversation.trace

    @contextlib.asynccontextmanager
    async def interaction(
        self, task: vf.Task[Any, Any, Any], **_: Any
    ) -> AsyncIterator[_Conversation]:
        """A conversation on ``task``; scored (when the play scores) as it closes."""
        trace: vf.Trace[Any, Any, Any] = vf.Trace(
            task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key,
                              hash=task.hash),
            agent=vf.AgentInfo(config=self.config, name=self.name, trainable=self.trainable),
        )
        self.traces.append(trace)
        conversation = _Conversation(self.play, task, trace)
        yield conversation
        trace.stop("user_closed")
        trace.ok = True
        if self.play.scoring:
            await task.score(trace)


@dataclass
class _Conversation:
    """verifiers' ``Interaction`` as the environment uses it: ``turn`` and ``trace``."""

    play: Play
    task: vf.Task[Any, Any, Any]
    trace: vf.Trace[Any, Any, Any]
    started: bool = False

    def _add(self, message: vf.Message, *, sampled: bool = False) -> None:
        parent = len(self.trace.nodes) - 1 if self.trace.nodes else None
        self.trace.nodes.append(vf.MessageNode(parent=parent, message=message, sampled=sampled))

    async def turn(self, message: str | vf.Messages | None = None) -> vf.Segment:
        """Send the environment's message (the prompt first), wait for the policy's reply."""
        data = self.task.data
        prompted = not self.started and data.prompt is not None
        if message is None and not prompted:
            raise ValueError("nothing to run a turn on: this exchange takes a user message")
        if message is not None and prompted:
            raise ValueError("the task's prompt opens this exchange: take it with a bare turn()")
        sent: list[vf.Message] = []
        if not self.started and data.system_prompt:
            sent.append(vf.SystemMessage(content=data.system_prompt))
        if prompted:
            prompt = data.prompt
            sent.extend([vf.UserMessage(content=prompt)] if isinstance(prompt, str) else prompt)
        elif isinstance(message, str):
            sent.append(vf.UserMessage(content=message))
        elif message is not None:
            sent.extend(parse_message(m) if isinstance(m, dict) else m
                        for m in message)
        self.started = True
        if self.trace.num_turns >= self.play.max_turns:
            self.trace.stop("max_turns")
            return vf.Segment(messages=[], terminated=True)
        for each in sent:
            self._add(each)
        reply = await self.play.ask(_text(sent))
        answer = vf.AssistantMessage(content=reply)
        self._add(answer, sampled=True)
        return vf.Segment(messages=[answer])


class _Agents:
    """``agents.<seat>`` for the environment's one declared seat."""

    def __init__(self, seat: _Seat) -> None:
        self._seat = seat

    def __getattr__(self, name: str) -> _Seat:
        if name != self.__dict__["_seat"].name:
            raise AttributeError(f"no agent {name!r}; this environment declares "
                                 f"{self.__dict__['_seat'].name!r}")
        return self.__dict__["_seat"]  # type: ignore[no-any-return]


class Play:
    """One episode of a verifiers environment, advanced a reply at a time.

    ``observation`` is what the environment waits for a reply to; ``send(reply)``
    advances to its next wait or to the episode's end (``done``). With ``scoring`` the
    rubric runs as each conversation closes and ``scored()`` reads it.
    """

    def __init__(self, spec: PlaySpec, seed: int, item: Mapping[str, Any] | None, *,
                 max_turns: int, scoring: bool = False) -> None:
        self.env = load(spec)
        self.task = task_for(spec, seed, item)
        self.max_turns = max_turns
        self.scoring = scoring
        name = seat_of(self.env)
        self._seat = _Seat(self, name, agent_config_fields(self.env.config)[name])
        self._episode: vf.Episode[Any, Any, Any] = vf.Episode(
            env=vf.EnvInfo(id=self.env.config.env_id),
            task=vf.TraceTask(type=type(self.task).__name__, data=self.task.data,
                              key=self.task.key, hash=self.task.hash),
        )
        self._loop = asyncio.new_event_loop()
        self._asked: _Ask | None = None
        self._waiting = asyncio.Event()
        self._main = self._loop.create_task(self._run())
        self._advance()

    async def _run(self) -> None:
        agents = _Agents(self._seat)
        await self.env.setup(agents)  # a stand-in for vf.Agents: the one seat
        await self.env.run(self.task, agents)
        self._episode.traces.extend(self._seat.traces)
        if not self._seat.traces:
            raise VerifiersEnvironmentError(
                f"{type(self.env).__name__}.run() ran no agent: nothing to score")
        if self.scoring:
            await self.env.finalize(self.task, self._episode)

    async def ask(self, text: str) -> str:
        """The environment's wait for the policy (called from the seat's turn)."""
        reply: asyncio.Future[str] = self._loop.create_future()
        self._asked = _Ask(text, reply)
        self._waiting.set()
        return await reply

    async def _until_wait(self) -> None:
        waiter = asyncio.ensure_future(self._waiting.wait())
        await asyncio.wait({self._main, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()

    def _advance(self) -> None:
        self._waiting.clear()
        self._loop.run_until_complete(self._until_wait())
        if self._main.done():
            self._asked = None
            self._loop.close()
            self._main.result()  # the environment's own error, raised here

    @property
    def done(self) -> bool:
        return self._main.done()

    @property
    def observation(self) -> str:
        if self._asked is None:
            raise VerifiersEnvironmentError("the episode is over")
        return self._asked.text

    def send(self, reply: str) -> None:
        """The policy's reply to the current observation."""
        if self._asked is None:
            raise VerifiersEnvironmentError("the episode is over")
        asked, self._asked = self._asked, None
        asked.reply.set_result(reply)
        self._advance()

    def close(self) -> None:
        """Stop an unfinished episode (its coroutine is cancelled)."""
        if not self._loop.is_closed():
            self._main.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                self._loop.run_until_complete(self._main)
            self._loop.close()

    @property
    def trace(self) -> vf.Trace[Any, Any, Any]:
        return self._seat.traces[-1]

    def scored(self) -> Scored:
        """The rubric's verdict on the finished episode (needs ``scoring``)."""
        if not self.done or not self.scoring:
            raise VerifiersEnvironmentError("score a finished, scoring play")
        trace = self.trace
        rewards = {k: r.value for k, r in trace.rewards.items() if r is not None}
        metrics = {k: v for k, v in trace.metrics.items() if v is not None}
        return Scored(trace.reward, rewards, metrics, trace.stop_condition, trace.num_turns,
                      trace.last_reply)


def replay(spec: PlaySpec, seed: int, item: Mapping[str, Any] | None,
           actions: Sequence[str], *, max_turns: int) -> Scored:
    """Replay recorded replies against a fresh episode and run the rubric on it."""
    play = Play(spec, seed, item, max_turns=max_turns, scoring=True)
    try:
        for action in actions:
            if play.done:
                break
            play.send(action)
        if not play.done:
            play.close()  # fewer replies than the environment asked for: judge what is there
            return _unfinished(play)
        return play.scored()
    finally:
        play.close()


def _unfinished(play: Play) -> Scored:
    trace = play.trace
    asyncio.run(play.task.score(trace))
    rewards = {k: r.value for k, r in trace.rewards.items() if r is not None}
    metrics = {k: v for k, v in trace.metrics.items() if v is not None}
    return Scored(trace.reward, rewards, metrics, "unfinished", trace.num_turns,
                  trace.last_reply)
