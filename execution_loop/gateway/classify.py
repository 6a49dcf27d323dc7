"""Which part of an agent a model request comes from: main loop, compression, sub-agent,
summary or heartbeat.

Only the main loop's calls make the trajectory the learner trains on; the others are
recorded with their kind and left out. The rules, in the order they are tried (the
first that matches decides, and its name is recorded with the call):

1. ``header``: the agent says so. The ``X-Triloop-Request-Kind`` header, or the
   ``triloop_request_kind`` metadata field, names one of the five kinds. An unknown
   name is refused (400), never guessed around.
2. ``agent-header``: the ``X-Triloop-Agent`` header (or ``triloop_agent`` metadata)
   names an agent other than ``main``: a sub-agent. Named ``main``, the request is the
   main loop unless rules 3-5 say otherwise (rule 6 is skipped, so an agent whose system
   prompt changes between its turns can say so).
3. ``heartbeat``: a liveness probe: a token cap of 1, or a conversation whose only
   non-system message is a short ping (``ping``, ``heartbeat``, ``health check``,
   ``are you there?``, ``hi``, ``test``).
4. ``compression``: the last user message (or the system prompt) asks to summarise,
   compact or condense *the conversation / context / history so far*, as coding
   agents' context-compaction prompts do ("create a detailed summary of the
   conversation so far", "context checkpoint compaction", "compact the conversation").
5. ``summary``: a side task that summarises or titles something else: a title for
   the conversation, "summarize the following ...", "in N words".
6. ``system-prompt``: the session's main loop is known (its first main-loop request
   fixed its system prompt) and this request's system prompt differs: a sub-agent.
7. ``default``: the main loop.

Content rules (3-6) are heuristics about prompts; rules 1-2 are exact. An agent that
compresses its context in a way these patterns miss is still handled: its next main
call no longer extends the trajectory, and the rebuild records a break there.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from execution_loop.gateway.api_shapes import SYSTEM, USER, ModelRequest

MAIN, COMPRESSION, SUB_AGENT, SUMMARY, HEARTBEAT = (
    "main", "compression", "sub_agent", "summary", "heartbeat"
)
KINDS = (MAIN, COMPRESSION, SUB_AGENT, SUMMARY, HEARTBEAT)
KIND_HEADER = "x-triloop-request-kind"
AGENT_HEADER = "x-triloop-agent"
KIND_METADATA = "triloop_request_kind"
AGENT_METADATA = "triloop_agent"

_PING = re.compile(
    r"^\s*(ping|pong|heartbeat|health ?check|are you (there|alive)\??|hi|hello|test)\s*[.!?]*\s*$",
    re.IGNORECASE,
)
_SUBJECT = (r"(the |this |our |your )?(entire |whole )?"
            r"(conversation|context|chat|session|history|dialog(ue)?|transcript)")
_COMPRESSION = (
    re.compile(r"\b(summari[sz]e|summary of|compact|condense|compress)\b[^.\n]{0,40}\b"
               + _SUBJECT, re.IGNORECASE),
    re.compile(r"\bcontext (checkpoint )?compaction\b", re.IGNORECASE),
    re.compile(r"\b(conversation|context) (so far|up to (now|this point))\b.{0,40}\bsummar",
               re.IGNORECASE | re.DOTALL),
)
_SUMMARY = (
    re.compile(r"\b(generate|write|give|suggest|create)\b.{0,30}\btitle\b", re.IGNORECASE),
    re.compile(r"\bsummari[sz]e (the following|this (text|file|page|document|output))\b",
               re.IGNORECASE),
    re.compile(r"\b(summari[sz]e|summary)\b.{0,40}\bin (\d+|one|a few|two|three) "
               r"(words|sentences?|lines?)\b", re.IGNORECASE),
)


class UnknownRequestKind(ValueError):
    """The agent named a request kind the gateway does not know."""


@dataclass(frozen=True)
class Classification:
    """A request's kind and the rule that decided it."""

    kind: str
    rule: str


def _named(headers: Mapping[str, str], request: ModelRequest, header: str, key: str) -> str | None:
    value = headers.get(header) or request.metadata.get(key)
    return value.strip().lower() if value else None


def _last_user_text(request: ModelRequest) -> str:
    for message in reversed(request.messages):
        if message.role == USER:
            return message.content
    return ""


def _is_heartbeat(request: ModelRequest) -> bool:
    if request.max_tokens == 1:
        return True
    talk = [m for m in request.messages if m.role != SYSTEM]
    return len(talk) == 1 and bool(_PING.match(talk[0].content))


def _matches(patterns: tuple[re.Pattern[str], ...], *texts: str | None) -> bool:
    return any(p.search(t) for p in patterns for t in texts if t)


def classify_request(
    request: ModelRequest,
    *,
    headers: Mapping[str, str],
    main_loop_seen: bool = False,
    main_system_prompt: str | None = None,
) -> Classification:
    """The request's kind by the rules above; ``headers`` keys are lower-case.

    ``main_loop_seen``: the session already had a main-loop call, whose system prompt
    (None: it had none) is ``main_system_prompt``.
    """
    named = _named(headers, request, KIND_HEADER, KIND_METADATA)
    if named is not None:
        if named not in KINDS:
            raise UnknownRequestKind(
                f"request kind {named!r} is not one of {', '.join(KINDS)}"
            )
        return Classification(named, "header")
    agent = _named(headers, request, AGENT_HEADER, AGENT_METADATA)
    if agent is not None and agent != MAIN:
        return Classification(SUB_AGENT, "agent-header")
    if _is_heartbeat(request):
        return Classification(HEARTBEAT, "heartbeat")
    last_user, system = _last_user_text(request), request.system_prompt
    if _matches(_COMPRESSION, last_user, system):
        return Classification(COMPRESSION, "compression")
    if _matches(_SUMMARY, last_user, system):
        return Classification(SUMMARY, "summary")
    if agent == MAIN:  # said to be the main loop: its system prompt may change freely
        return Classification(MAIN, "agent-header")
    if main_loop_seen and system != main_system_prompt:
        return Classification(SUB_AGENT, "system-prompt")
    return Classification(MAIN, "default")
