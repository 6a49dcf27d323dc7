"""The official ``openai`` client against the real gateway: every row of issue 31's table
that OpenAI's APIs have, checked on what the client parsed and on the session's record.

The policy is scripted (see ``tests.gateway_sdk_support``); the gateway, its HTTP server,
the chat template's rendering and the record are the real ones.
"""

from __future__ import annotations

import json
from typing import Any

import openai
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

CHAT_TOOLS: list[Any] = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers", "parameters": ADD_SCHEMA}}]
RESPONSES_TOOLS: list[Any] = [{"type": "function", "name": "add",
                               "description": "Add two integers", "parameters": ADD_SCHEMA}]
QUESTION: list[Any] = [{"role": "system", "content": "Use the tools."},
                       {"role": "user", "content": "What is 3 + 4?"}]


@pytest.fixture
def client(served: Served) -> openai.OpenAI:
    return openai.OpenAI(api_key="unused", max_retries=0,
                         base_url=f"{served.server.session_url(served.session.id)}/v1")


def test_required_tool_choice_returns_tool_calls_and_takes_the_result_back(
    served: Served, client: openai.OpenAI
) -> None:
    served.script(AFTER_ANY_OPENING, "It is 7.")
    first = client.chat.completions.create(model="m", messages=QUESTION, tools=CHAT_TOOLS,
                                           tool_choice="required")
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "add"
    assert json.loads(call.function.arguments) == {"a": 3, "b": 4}
    one = served.session.calls[0]
    # The call's opening was forced into the prompt; what the model wrote is all sampled.
    assert served.decoded(one.prompt_token_ids[-one.forced_prefix_tokens:]).startswith(
        "<tool_call>")
    assert served.decoded(one.completion_token_ids) == AFTER_ANY_OPENING
    second = client.chat.completions.create(model="m", tools=CHAT_TOOLS, messages=[
        *QUESTION, choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "7"}])
    assert second.choices[0].message.content == "It is 7."
    two = served.session.calls[1]
    assert_extends(one.prompt_token_ids, one.completion_token_ids, two.prompt_token_ids)
    assert served.session.rebuilt().breaks == []


def test_a_named_tool_choice_and_an_auto_call(served: Served, client: openai.OpenAI) -> None:
    served.script(AFTER_NAMED_OPENING, CALL_ADD)
    named = client.chat.completions.create(
        model="m", messages=QUESTION, tools=CHAT_TOOLS,
        tool_choice={"type": "function", "function": {"name": "add"}})
    assert (named.choices[0].message.tool_calls or [])[0].function.name == "add"
    auto = client.chat.completions.create(model="m", messages=QUESTION, tools=CHAT_TOOLS)
    assert auto.choices[0].finish_reason == "tool_calls"
    assert auto.choices[0].message.content is None


def test_a_malformed_call_is_recorded_with_its_reason_and_returned_as_text(
    served: Served, client: openai.OpenAI
) -> None:
    bad = '<tool_call>\n{"name": "add", "arguments": {"a": "three", "b": 4}}\n</tool_call>'
    served.script(bad)
    answer = client.chat.completions.create(model="m", messages=QUESTION, tools=CHAT_TOOLS)
    assert answer.choices[0].message.content == bad
    assert answer.choices[0].message.tool_calls is None
    assert answer.choices[0].finish_reason == "stop"
    [call] = served.session.calls
    assert call.tool_call_error == "add: argument a must be integer"
    assert served.decoded(call.completion_token_ids) == bad


def test_chat_streams_text_and_tool_calls(served: Served, client: openai.OpenAI) -> None:
    served.script(COUNTING, CALL_ADD)
    with client.chat.completions.stream(model="m", messages=QUESTION) as stream:
        pieces = [e.delta for e in stream if e.type == "content.delta"]
        final = stream.get_final_completion()
    assert len(pieces) > 1 and "".join(pieces) == COUNTING
    assert final.choices[0].message.content == COUNTING
    with client.chat.completions.stream(model="m", messages=QUESTION,
                                        tools=CHAT_TOOLS) as stream:
        final = stream.get_final_completion()
    [call] = final.choices[0].message.tool_calls or []
    assert call.function.name == "add" and json.loads(call.function.arguments) == {
        "a": 3, "b": 4}
    assert final.choices[0].finish_reason == "tool_calls"


def test_stop_sequences_and_logprobs(served: Served, client: openai.OpenAI) -> None:
    served.script(COUNTING, "answer: 7")
    stopped = client.chat.completions.create(model="m", messages=QUESTION, stop=[" four"])
    assert stopped.choices[0].message.content == "one two three"
    assert stopped.choices[0].finish_reason == "stop"
    call = served.session.calls[0]
    assert call.stop_sequence == " four"
    assert served.decoded(call.completion_token_ids) == "one two three four"  # as sampled
    scored = client.chat.completions.create(model="m", messages=QUESTION, logprobs=True)
    content = (scored.choices[0].logprobs and scored.choices[0].logprobs.content) or []
    assert "".join(t.token for t in content) == "answer: 7"
    assert {t.logprob for t in content} == {-0.25}


def test_responses_function_calls_previous_response_id_and_reasoning_items(
    served: Served, client: openai.OpenAI
) -> None:
    served.script(CALL_ADD, "It is 7.", AFTER_ANY_OPENING)
    first = client.responses.create(model="m", instructions="Use the tools.",
                                    input="What is 3 + 4?", tools=RESPONSES_TOOLS)
    [call] = [item for item in first.output if item.type == "function_call"]
    assert call.name == "add" and json.loads(call.arguments) == {"a": 3, "b": 4}
    second = client.responses.create(
        model="m", instructions="Use the tools.", tools=RESPONSES_TOOLS,
        previous_response_id=first.id,
        input=[{"type": "reasoning", "id": "rs_1", "summary": []},
               {"type": "function_call_output", "call_id": call.call_id, "output": "7"}])
    assert second.output_text == "It is 7."
    one, two = served.session.calls
    assert_extends(one.prompt_token_ids, one.completion_token_ids, two.prompt_token_ids)
    forced = client.responses.create(model="m", input="3 + 4?", tools=RESPONSES_TOOLS,
                                     tool_choice="required")
    assert [item.type for item in forced.output] == ["function_call"]
    with pytest.raises(openai.BadRequestError) as unknown:
        client.responses.create(model="m", input="x", previous_response_id="resp_nope")
    assert unknown.value.code == "previous_response_not_found"


def test_responses_stream_the_full_event_sequence(served: Served, client: openai.OpenAI) -> None:
    served.script(COUNTING, CALL_ADD)
    with client.responses.stream(model="m", input="count",
                                 include=["message.output_text.logprobs"]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds.index("response.output_item.added") < kinds.index(
        "response.content_part.added") < kinds.index("response.output_text.delta")
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert kinds.count("response.output_text.delta") > 1
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.output_text == COUNTING
    [message] = final.output
    assert message.type == "message" and message.content[0].type == "output_text"
    logprobs = message.content[0].logprobs or []
    assert "".join(t.token for t in logprobs) == COUNTING and logprobs[0].logprob == -0.25
    with client.responses.stream(model="m", input="add", tools=RESPONSES_TOOLS) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.done" in kinds
    assert [item.type for item in final.output] == ["function_call"]


def test_response_format_is_refused_and_errors_come_in_openai_s_shape(
    served: Served, client: openai.OpenAI
) -> None:
    schema: Any = {"type": "json_schema", "json_schema": {"name": "n", "schema": {}}}
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="m", messages=QUESTION, response_format=schema)
    assert refused.value.param == "response_format"
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="m", input="x", text={"format": {
            "type": "json_schema", "name": "n", "schema": {}}})
    assert refused.value.param == "text.format"
    with pytest.raises(openai.BadRequestError) as two:
        client.chat.completions.create(model="m", messages=QUESTION, n=2)
    assert two.value.param == "n" and two.value.type == "invalid_request_error"
    stranger = openai.OpenAI(api_key="unused", max_retries=0,
                             base_url=f"{served.server.url}/s/nobody/v1")
    with pytest.raises(openai.NotFoundError):
        stranger.chat.completions.create(model="m", messages=QUESTION)
    assert served.session.calls == []


def test_models_list_and_retrieve(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["scripted"]
    assert client.models.retrieve("scripted").owned_by == "triloop"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-nothing")
