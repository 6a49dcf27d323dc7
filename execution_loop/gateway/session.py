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

Tool calls: when the request declares tools, the answer is read for calls in the model's
format (``tool_calls.parse_tool_calls``); each call gets an id, and an assistant message
that comes back with those ids is rendered as the ids that were sampled. Where the agent
requires a call (``tool_choice`` required or a named tool), the opening of a call is
forced into the prompt (``forced_call_prefix``; its ids are prompt, not sampled), so the
answer is a call from its first sampled token (the decoding is constrained to that
opening, not to the schema: a call the model then botches is a malformed one). A call
that does not parse or fit its schema is recorded with its reason
(``CallRecord.tool_call_error``) and goes back as text.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from execution_loop.episode import turn_seed
from execution_loop.gateway.api_bodies import call_id, response_id
from execution_loop.gateway.api_shapes import (
    ASSISTANT,
    RESPONSES,
    SYSTEM,
    ChatMessage,
    Completion,
    ModelRequest,
    TokenLogprob,
)
from execution_loop.gateway.classify import MAIN, classify_request
from execution_loop.gateway.rebuild import MainCall, RebuiltTrajectory, SessionTrajectory
from execution_loop.gateway.rendering import MessageRenderer
from execution_loop.gateway.sampling import SampledAnswer, sample_answer
from execution_loop.inference.base import (
    InferenceError,
    PolicyClient,
    PromptTooLongError,
    decode_action,
)
from execution_loop.tool_calls import (
    ParsedToolCalls,
    ToolCall,
    ToolCallError,
    forced_call_prefix,
    parse_tool_calls,
    tool_markers,
)


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
    tool_calls: tuple[ToolCall, ...] = ()  # the calls read from the answer
    tool_call_error: str | None = None  # why the answer's call was malformed (sent as text)
    forced_prefix_tokens: int = 0  # the prompt's last ids: a call's opening, forced
    stop_sequence: str | None = None  # the agent's stop sequence that ended the answer


class AnswerStream(Protocol):
    """Where a streamed answer's text goes as it is sampled."""

    def begin(self, response_id: str, prompt_tokens: int) -> None:
        """The request passed every check; sampling of the answer so named starts."""
        ...

    def text(self, delta: str) -> None:
        """More of the answer's text."""
        ...


@dataclass
class _Beginning:
    """Begins a stream at its first text (or when the answer is done), so that a request
    the backend refuses before any token (a prompt past the context) is a plain error."""

    stream: AnswerStream | None
    response_id: str
    prompt_tokens: int
    begun: bool = False

    def begin(self) -> None:
        if self.stream is not None and not self.begun:
            self.begun = True
            self.stream.begin(self.response_id, self.prompt_tokens)

    def text(self, delta: str) -> None:
        self.begin()
        if self.stream is not None:
            self.stream.text(delta)


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
    _sampled_calls: dict[str, list[int]] = field(default_factory=dict)  # by tool-call id
    _responses: dict[str, tuple[ChatMessage, ...]] = field(default_factory=dict)  # Responses
    _main_seen: bool = False
    _main_system: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def complete(self, request: ModelRequest, headers: Mapping[str, str],
                 stream: AnswerStream | None = None) -> Completion:
        """Classify, render, sample and record one request; the answer goes back to the agent
        (as it is sampled, to ``stream``)."""
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
            messages = self._conversation(request)
            prompt = self._prompt(messages)
            forced = self._forced_prefix(request)
            prompt += forced[1]
            index = len(self.calls)
            answer_id = response_id(request.api, uuid.uuid4().hex)
            begun = _Beginning(stream, answer_id, len(prompt))
            sampled = self._sample(request, prompt, budget, index,
                                   None if stream is None else begun.text)
            begun.begin()
            fed: Sequence[int] = prompt
            if decided.kind == MAIN:  # spliced on; the prompt is then read from the sequence
                try:
                    placed = self.trajectory.add(
                        MainCall(prompt, sampled.token_ids, sampled.logprobs))
                except ValueError as exc:  # nothing spliced: the backend's answer is unusable
                    self.infrastructure_error = InferenceError(f"the policy's answer: {exc}")
                    raise GatewayError(502, f"the model backend failed: {exc}",
                                       kind="api_error", code="backend_error") from exc
                fed = self.trajectory.prompt(placed.call)
            self.generated_tokens += len(sampled.token_ids)
            parsed, error = self._read_calls(request, forced[0] + sampled.text)
            ids = [f"{uuid.uuid4().hex[:24]}" for _ in parsed.calls]
            call_ids = tuple(call_id(request.api, i) for i in ids)
            record = CallRecord(
                index=index, api=request.api, kind=decided.kind, rule=decided.rule,
                prompt_token_ids=fed, completion_token_ids=list(sampled.token_ids),
                logprobs=list(sampled.logprobs), text=sampled.text,
                finish_reason="tool_calls" if parsed.calls else sampled.finish_reason,
                requested_temperature=request.temperature,
                requested_max_tokens=request.max_tokens, tool_calls=parsed.calls,
                tool_call_error=error, forced_prefix_tokens=len(forced[1]),
                stop_sequence=sampled.stop_sequence,
            )
            self.calls.append(record)
            text = parsed.text if parsed.calls else forced[0] + sampled.text
            self._remember(record, text, forced[1], call_ids)
            if decided.kind == MAIN and not self._main_seen:
                self._main_seen, self._main_system = True, request.system_prompt
            if request.api == RESPONSES and request.store:
                self._responses[answer_id] = (*[m for m in messages if m.role != SYSTEM],
                                              ChatMessage(ASSISTANT, text, parsed.calls,
                                                          call_ids))
            return Completion(text=text, finish_reason=record.finish_reason,
                              prompt_tokens=len(prompt),
                              completion_tokens=len(record.completion_token_ids),
                              kind=record.kind, call_index=index, response_id=answer_id,
                              tool_calls=parsed.calls, call_ids=call_ids,
                              stop_sequence=sampled.stop_sequence,
                              logprobs=self._logprobs(record) if request.logprobs else ())

    def count_tokens(self, request: ModelRequest) -> int:
        """The prompt tokens the request would be fed (Anthropic's ``count_tokens``)."""
        with self._lock:
            return len(self._prompt(self._conversation(request)))

    def _conversation(self, request: ModelRequest) -> tuple[ChatMessage, ...]:
        """The request's messages, after the stored turn it continues (Responses)."""
        if request.previous_response_id is None:
            return request.messages
        earlier = self._responses.get(request.previous_response_id)
        if earlier is None:
            raise GatewayError(
                400, f"Previous response with id '{request.previous_response_id}' not found.",
                param="previous_response_id", code="previous_response_not_found")
        system = [m for m in request.messages if m.role == SYSTEM]
        rest = [m for m in request.messages if m.role != SYSTEM]
        return (*system, *earlier, *rest)

    def _prompt(self, messages: tuple[ChatMessage, ...]) -> list[int]:
        try:
            return self.renderer.prompt_ids(messages, self._sampled_ids)
        except ValueError as exc:
            raise GatewayError(400, f"cannot render the conversation: {exc}") from exc

    def _forced_prefix(self, request: ModelRequest) -> tuple[str, list[int]]:
        """The opening of a call and its ids, where the request requires a call."""
        if not request.calls_tools or request.tool_choice != "required":
            return "", []
        text = forced_call_prefix(self.renderer.tool_call_format, request.forced_tool)
        ids = self.renderer.tokenizer(text, add_special_tokens=False).input_ids
        return text, [int(i) for i in ids]

    def _sample(self, request: ModelRequest, prompt: list[int], budget: int, index: int,
                on_text: Callable[[str], None] | None) -> SampledAnswer:
        hold = tool_markers(self.renderer.tool_call_format) if request.calls_tools else ()
        forced = request.calls_tools and request.tool_choice == "required"
        try:
            return sample_answer(
                self.settings.policy, prompt, budget=budget,
                temperature=self.settings.temperature,
                seed=turn_seed(self.settings.seed, index), stops=request.stop,
                on_text=None if forced else on_text, hold_back=hold)
        except PromptTooLongError as exc:
            self.context_overflows += 1
            raise GatewayError(400, str(exc), code="context_length_exceeded") from exc
        except InferenceError as exc:
            self.infrastructure_error = exc
            raise GatewayError(502, f"the model backend failed: {exc}",
                               kind="api_error", code="backend_error") from exc

    def _read_calls(self, request: ModelRequest, text: str) -> tuple[ParsedToolCalls,
                                                                      str | None]:
        """The answer's tool calls, or why its call is malformed (the answer is then text)."""
        if not request.calls_tools:
            return ParsedToolCalls(text, ()), None
        try:
            return parse_tool_calls(text, request.tools, self.renderer.tool_call_format), None
        except ToolCallError as exc:
            return ParsedToolCalls(text, ()), str(exc)

    def _logprobs(self, record: CallRecord) -> tuple[TokenLogprob, ...]:
        tokenizer, special = self.renderer.tokenizer, set(self.renderer.tokenizer.all_special_ids)
        return tuple(TokenLogprob(decode_action(tokenizer, [i]), lp)
                     for i, lp in zip(record.completion_token_ids, record.logprobs, strict=True)
                     if i not in special)

    def _remember(self, record: CallRecord, text: str, forced: list[int],
                  call_ids: tuple[str, ...]) -> None:
        ids = forced + record.completion_token_ids
        for key in {text, text.strip()} - {""}:  # an empty text names no answer
            self._sampled[key] = ids
        for ident in call_ids:
            self._sampled_calls[ident] = ids

    def _sampled_ids(self, message: ChatMessage) -> list[int] | None:
        """The ids sampled for an assistant message: by its tool calls' ids, else by its
        text as sent or with surrounding whitespace stripped."""
        for ident in message.call_ids:
            if ident in self._sampled_calls:
                return self._sampled_calls[ident]
        if message.tool_calls:
            return None  # calls the gateway did not sample: rendered from their JSON
        found = self._sampled.get(message.content)
        return found if found is not None else self._sampled.get(message.content.strip())

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
