"""The official ``anthropic`` client against the real gateway: every row of issue 31's
table that the Messages API has (tool use both ways, tool_choice any / named, streaming,
stop_sequences, count_tokens, the models routes, error bodies), checked on what the
client parsed and on the session's record. The policy is scripted (see
``tests.gateway_sdk_support``)."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from tests.gateway_sdk_support import (
    ADD_SCHEMA,
    AFTER_ANY_OPENING,
    AFTER_NAMED_OPENING,
    CALL_ADD,
    COUNTING,
    Served,
    assert_extends,
)

TOOLS: list[Any] = [{"name": "add", "description": "Add two integers",
                     "input_schema": ADD_SCHEMA}]
QUESTION: list[Any] = [{"role": "user", "content": "What is 3 + 4?"}]


@pytest.fixture
def client(served: Served) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="unused", max_retries=0,
                               base_url=served.server.session_url(served.session.id))


def test_tool_choice_any_returns_tool_use_and_takes_the_result_back(
    served: Served, client: anthropic.Anthropic
) -> None:
    served.script(AFTER_ANY_OPENING, "It is 7.")
    first = client.messages.create(model="m", max_tokens=100, system="Use the tools.",
                                   messages=QUESTION, tools=TOOLS,
                                   tool_choice={"type": "any"})
    assert first.stop_reason == "tool_use"
    [use] = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "add" and use.input == {"a": 3, "b": 4}
    assert use.id.startswith("toolu_")
    second = client.messages.create(model="m", max_tokens=100, system="Use the tools.",
                                    tools=TOOLS, messages=[
        *QUESTION, {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                      "content": "7"}]}])
    assert second.stop_reason == "end_turn"
    assert [b.text for b in second.content if b.type == "text"] == ["It is 7."]
    one, two = served.session.calls
    assert_extends(one.prompt_token_ids, one.completion_token_ids, two.prompt_token_ids)
    assert served.session.rebuilt().breaks == []


def test_a_named_tool_and_an_auto_call(served: Served, client: anthropic.Anthropic) -> None:
    served.script(AFTER_NAMED_OPENING, CALL_ADD)
    named = client.messages.create(model="m", max_tokens=100, messages=QUESTION, tools=TOOLS,
                                   tool_choice={"type": "tool", "name": "add"})
    assert [b.type for b in named.content] == ["tool_use"]
    auto = client.messages.create(model="m", max_tokens=100, messages=QUESTION, tools=TOOLS)
    assert auto.stop_reason == "tool_use"


def test_streams_text_and_tool_use(served: Served, client: anthropic.Anthropic) -> None:
    served.script(COUNTING, CALL_ADD)
    with client.messages.stream(model="m", max_tokens=100, messages=QUESTION) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == COUNTING
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == len(
        served.session.calls[0].completion_token_ids)
    with client.messages.stream(model="m", max_tokens=100, messages=QUESTION,
                                tools=TOOLS) as stream:
        final = stream.get_final_message()
    [use] = [b for b in final.content if b.type == "tool_use"]
    assert use.input == {"a": 3, "b": 4} and final.stop_reason == "tool_use"


def test_stop_sequences_are_honoured(served: Served, client: anthropic.Anthropic) -> None:
    served.script(COUNTING, COUNTING)
    stopped = client.messages.create(model="m", max_tokens=100, messages=QUESTION,
                                     stop_sequences=[" four"])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == " four"
    assert [b.text for b in stopped.content if b.type == "text"] == ["one two three"]
    # Streamed, the text that turned out to be the stop sequence was never shown.
    with client.messages.stream(model="m", max_tokens=100, messages=QUESTION,
                                stop_sequences=[" nine"]) as stream:
        shown = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert shown == "one two three four five six seven eight"
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == " nine"


def test_count_tokens_is_the_prompt_the_model_is_fed(
    served: Served, client: anthropic.Anthropic
) -> None:
    counted = client.messages.count_tokens(model="m", system="Use the tools.",
                                           messages=QUESTION, tools=TOOLS)
    served.script("answer: 7")
    client.messages.create(model="m", max_tokens=10, system="Use the tools.",
                           messages=QUESTION, tools=TOOLS)
    assert counted.input_tokens == len(served.session.calls[0].prompt_token_ids)


def test_models_routes_in_anthropic_s_shape(client: anthropic.Anthropic) -> None:
    [model] = list(client.models.list())
    assert model.id == "scripted" and model.type == "model"
    assert client.models.retrieve("scripted").display_name == "scripted"
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.models.retrieve("claude-nothing")
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]


def test_errors_come_in_anthropic_s_shape(served: Served, client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as image:
        client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": ""}}]}])
    assert image.value.body["type"] == "error"  # type: ignore[index]
    assert image.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError, match="no tools"):
        client.messages.create(model="m", max_tokens=10, messages=QUESTION,
                               tool_choice={"type": "any"})
    stranger = anthropic.Anthropic(api_key="unused", max_retries=0,
                                   base_url=f"{served.server.url}/s/nobody")
    with pytest.raises(anthropic.NotFoundError):
        stranger.messages.create(model="m", max_tokens=10, messages=QUESTION)
    assert served.session.calls == []
