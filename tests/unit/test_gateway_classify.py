"""Request classification: explicit headers first, then the documented content rules."""

from __future__ import annotations

import pytest

from execution_loop.gateway.api_shapes import ChatMessage, ModelRequest
from execution_loop.gateway.classify import (
    COMPRESSION,
    HEARTBEAT,
    MAIN,
    SUB_AGENT,
    SUMMARY,
    UnknownRequestKind,
    classify_request,
)

SYSTEM = "You solve arithmetic problems."


def request(*messages: tuple[str, str], max_tokens: int | None = None,
            metadata: dict[str, str] | None = None) -> ModelRequest:
    return ModelRequest(api="chat.completions", model="m",
                        messages=tuple(ChatMessage(r, c) for r, c in messages),
                        max_tokens=max_tokens, temperature=None, metadata=metadata or {})


MAIN_TURN = request(("system", SYSTEM), ("user", "What is 3 + 4?"))


def kind(req: ModelRequest, headers: dict[str, str] | None = None, *, seen: bool = True,
         system: str | None = SYSTEM) -> tuple[str, str]:
    decided = classify_request(req, headers=headers or {}, main_loop_seen=seen,
                               main_system_prompt=system)
    return decided.kind, decided.rule


def test_a_plain_turn_is_the_main_loop() -> None:
    assert kind(MAIN_TURN, seen=False) == (MAIN, "default")
    assert kind(MAIN_TURN) == (MAIN, "default")


@pytest.mark.parametrize("named", ["compression", "summary", "heartbeat", "sub_agent", "main"])
def test_the_header_or_metadata_decides_first(named: str) -> None:
    assert kind(MAIN_TURN, {"x-triloop-request-kind": named}) == (named, "header")
    tagged = request(("user", "ping"), metadata={"triloop_request_kind": named.upper()})
    assert kind(tagged) == (named, "header")


def test_an_unknown_named_kind_is_refused_not_guessed() -> None:
    with pytest.raises(UnknownRequestKind, match="'planner' is not one of"):
        kind(MAIN_TURN, {"x-triloop-request-kind": "planner"})


def test_an_agent_header_other_than_main_is_a_sub_agent() -> None:
    assert kind(MAIN_TURN, {"x-triloop-agent": "researcher"}) == (SUB_AGENT, "agent-header")
    assert kind(MAIN_TURN, {"x-triloop-agent": "main"}) == (MAIN, "agent-header")
    # Said to be the main loop, a changed system prompt does not make it a sub-agent...
    dated = request(("system", SYSTEM + " Today is Tuesday."), ("user", "What is 3 + 4?"))
    assert kind(dated) == (SUB_AGENT, "system-prompt")
    assert kind(dated, {"x-triloop-agent": "main"}) == (MAIN, "agent-header")
    # ...but its compression is still a compression.
    compress = request(("system", SYSTEM), ("user", "Summarize the conversation so far."))
    assert kind(compress, {"x-triloop-agent": "main"}) == (COMPRESSION, "compression")


@pytest.mark.parametrize("text", ["ping", "Are you there?", "  heartbeat ", "hi!"])
def test_pings_are_heartbeats(text: str) -> None:
    assert kind(request(("system", SYSTEM), ("user", text))) == (HEARTBEAT, "heartbeat")


def test_a_one_token_request_is_a_heartbeat() -> None:
    assert kind(request(("user", "What is 3 + 4?"), max_tokens=1))[0] == HEARTBEAT


@pytest.mark.parametrize("ask", [
    "Your task is to create a detailed summary of the conversation so far.",
    "Please summarize our conversation so that you can continue the work.",
    "You are performing a CONTEXT CHECKPOINT COMPACTION.",
    "Compact the context: keep the facts you need.",
])
def test_context_compaction_prompts_are_compression(ask: str) -> None:
    history = request(("system", SYSTEM), ("user", "What is 3 + 4?"), ("assistant", "7"),
                      ("user", "wrong"), ("user", ask))
    assert kind(history) == (COMPRESSION, "compression")


@pytest.mark.parametrize("ask", [
    "Generate a short title for this conversation.",
    "Summarize the following text: the tests failed twice.",
    "Give a summary of the diff in 5 words.",
])
def test_side_summaries_and_titles_are_summary(ask: str) -> None:
    assert kind(request(("user", ask))) == (SUMMARY, "summary")


def test_another_system_prompt_after_the_main_loop_is_a_sub_agent() -> None:
    helper = request(("system", "You are a code search helper."), ("user", "find add()"))
    assert kind(helper) == (SUB_AGENT, "system-prompt")
    assert kind(helper, seen=False) == (MAIN, "default")  # the first call fixes the main loop
    # A main loop without a system prompt: a later request with one is a sub-agent.
    assert kind(helper, system=None) == (SUB_AGENT, "system-prompt")
