"""The gateway's core: per agent session, classify each model request, render it as token
ids, sample from the configured ``PolicyClient`` and record what was sampled.

A session is one episode of one agent. Every call is recorded (``CallRecord``): its API,
its kind and the rule that decided it, the prompt ids as fed, the sampled ids and their
behaviour logprobs. A main-loop call's tokens are spliced onto the session's one sequence
as it is made (``rebuild.SessionTrajectory``) and its prompt is read in place from there,
so the session holds its main loop's tokens once, however many calls it makes.
Sampling uses the episode's temperature and a per-call seed, never
the agent's own temperature: the learner's importance ratios compare against
logprobs at the run's temperature, so the agent's is recorded and not applied.
Token caps are the contract's: ``max_tokens_per_turn`` per call (the agent may ask for
fewer) and ``max_total_tokens`` over the session, every kind of call counted.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from execution_loop.episode import turn_seed
from execution_loop.gateway.api_shapes import Completion, ModelRequest
from execution_loop.gateway.classify import MAIN, classify_request
from execution_loop.gateway.rebuild import MainCall, RebuiltTrajectory, SessionTrajectory
from execution_loop.gateway.rendering import MessageRenderer
from execution_loop.inference.base import InferenceError, PolicyClient, PromptTooLongError


class GatewayError(Exception):
    """A request the gateway answers with an error; ``status`` is the HTTP status."""

    def __init__(self, status: int, message: str, *, kind: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.code = code
        self.param = param


@dataclass(frozen=True)
class SessionSettings:
    """How a session samples: the policy, its temperature and seed, the token caps."""

    policy: PolicyClient
    temperature: float  # the behaviour policy's temperature (the run's, not the agent's)
    seed: int  # call k samples with turn_seed(seed, k)
    max_tokens_per_turn: int  # tokens one call may generate
    max_total_tokens: int  # tokens the whole session may generate, every kind counted


@dataclass(frozen=True)
class CallRecord:
    """One model call as it happened."""

    index: int
    api: str
    kind: str  # main | compression | sub_agent | summary | heartbeat
    rule: str  # the classification rule that decided the kind
    prompt_token_ids: Sequence[int]  # main loop: a view into the session's sequence
    completion_token_ids: list[int]
    logprobs: list[float]  # behaviour logprob of each sampled id
    text: str
    finish_reason: str
    requested_temperature: float | None  # what the agent asked for (recorded, not applied)
    requested_max_tokens: int | None


@dataclass
class AgentSession:
    """One agent episode's model traffic."""

    id: str
    settings: SessionSettings
    renderer: MessageRenderer
    calls: list[CallRecord] = field(default_factory=list)
    trajectory: SessionTrajectory = field(default_factory=SessionTrajectory)  # main loop
    generated_tokens: int = 0
    budget_exhausted: bool = False
    context_overflows: int = 0
    infrastructure_error: InferenceError | None = None
    closed: bool = False
    _sampled: dict[str, list[int]] = field(default_factory=dict)
    _main_seen: bool = False
    _main_system: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def complete(self, request: ModelRequest, headers: Mapping[str, str]) -> Completion:
        """Classify, render, sample and record one request; the text goes back to the agent."""
        with self._lock:
            if self.closed:
                raise GatewayError(410, f"session {self.id} has ended", code="session_closed")
            try:
                decided = classify_request(request, headers=headers,
                                           main_loop_seen=self._main_seen,
                                           main_system_prompt=self._main_system)
            except ValueError as exc:
                raise GatewayError(400, str(exc), param="x-triloop-request-kind") from exc
            budget = min(self.settings.max_tokens_per_turn,
                         self.settings.max_total_tokens - self.generated_tokens)
            if request.max_tokens is not None:
                budget = min(budget, request.max_tokens)
            if budget <= 0:
                self.budget_exhausted = True
                raise GatewayError(429, "the episode's token budget (max_total_tokens) is spent",
                                   kind="rate_limit_error", code="token_budget_exhausted")
            try:
                prompt = self.renderer.prompt_ids(request.messages, self._sampled_ids)
            except ValueError as exc:
                raise GatewayError(400, f"cannot render the conversation: {exc}") from exc
            index = len(self.calls)
            try:
                generation = self.settings.policy.generate(
                    prompt, max_new_tokens=budget, temperature=self.settings.temperature,
                    seed=turn_seed(self.settings.seed, index))
            except PromptTooLongError as exc:
                self.context_overflows += 1
                raise GatewayError(400, str(exc), code="context_length_exceeded") from exc
            except InferenceError as exc:
                self.infrastructure_error = exc
                raise GatewayError(502, f"the model backend failed: {exc}",
                                   kind="api_error", code="backend_error") from exc
            fed: Sequence[int] = prompt
            if decided.kind == MAIN:  # spliced on; the prompt is then read from the sequence
                try:
                    placed = self.trajectory.add(
                        MainCall(prompt, generation.token_ids, generation.logprobs))
                except ValueError as exc:  # nothing spliced: the backend's answer is unusable
                    self.infrastructure_error = InferenceError(f"the policy's answer: {exc}")
                    raise GatewayError(502, f"the model backend failed: {exc}",
                                       kind="api_error", code="backend_error") from exc
                fed = self.trajectory.prompt(placed.call)
            self.generated_tokens += len(generation.token_ids)
            record = CallRecord(
                index=index, api=request.api, kind=decided.kind, rule=decided.rule,
                prompt_token_ids=fed, completion_token_ids=list(generation.token_ids),
                logprobs=list(generation.logprobs), text=generation.text,
                finish_reason=generation.finish_reason,
                requested_temperature=request.temperature,
                requested_max_tokens=request.max_tokens,
            )
            self.calls.append(record)
            self._remember(record)
            if decided.kind == MAIN and not self._main_seen:
                self._main_seen, self._main_system = True, request.system_prompt
            return Completion(text=record.text, finish_reason=record.finish_reason,
                              prompt_tokens=len(prompt),
                              completion_tokens=len(record.completion_token_ids),
                              kind=record.kind, call_index=index)

    def _remember(self, record: CallRecord) -> None:
        for key in (record.text, record.text.strip()):
            self._sampled[key] = record.completion_token_ids

    def _sampled_ids(self, text: str) -> list[int] | None:
        """The ids sampled for this text, as sent or with surrounding whitespace stripped."""
        found = self._sampled.get(text)
        return found if found is not None else self._sampled.get(text.strip())

    def main_calls(self) -> list[CallRecord]:
        """The main loop's calls, in order."""
        return [c for c in self.calls if c.kind == MAIN]

    def rebuilt(self) -> RebuiltTrajectory:
        """The main loop's trajectory as segments (see ``rebuild``)."""
        return self.trajectory.rebuilt()

    def kinds(self) -> dict[str, int]:
        """How many calls of each kind the session made."""
        counts: dict[str, int] = {}
        for call in self.calls:
            counts[call.kind] = counts.get(call.kind, 0) + 1
        return counts


class Gateway:
    """Agent sessions by id; one gateway can serve many episodes at once."""

    def __init__(self) -> None:
        self._sessions: dict[str, AgentSession] = {}
        self._lock = threading.Lock()

    def open_session(self, settings: SessionSettings) -> AgentSession:
        """A new session with an unguessable id (it is the agent's only credential)."""
        session = AgentSession(id=uuid.uuid4().hex, settings=settings,
                               renderer=MessageRenderer(settings.policy.tokenizer()))
        with self._lock:
            self._sessions[session.id] = session
        return session

    def session(self, session_id: str) -> AgentSession:
        """The open session with that id, or a 404."""
        with self._lock:
            session = self._sessions.get(session_id)
        if session is None or session.closed:
            raise GatewayError(404, "no open agent session with that id",
                               kind="not_found_error", code="unknown_session")
        return session

    def close_session(self, session_id: str) -> AgentSession:
        """End a session: later requests get 404; returns it for its record."""
        with self._lock:
            session = self._sessions.pop(session_id)
        with session._lock:
            session.closed = True
        return session
