"""The three model APIs reduced to one request shape (pure parsing, no server)."""

from __future__ import annotations

import json

import pytest

from execution_loop.gateway.api_bodies import anthropic_message_body, responses_body
from execution_loop.gateway.api_shapes import (
    TOOLS_HEADER,
    ChatMessage,
    Completion,
    RequestShapeError,
    parse_anthropic_messages,
    parse_chat_completions,
    parse_responses,
)
from execution_loop.tool_calls import ToolCall

ADD = {"name": "add", "description": "Add two integers",
       "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}


def test_chat_completions_keeps_tool_calls_with_their_ids_and_results_as_text() -> None:
    call = [{"id": "c1", "type": "function",
             "function": {"name": "add", "arguments": "{\"a\": 3}"}}]
    parsed = parse_chat_completions({"max_completion_tokens": 9, "messages": [
        {"role": "developer", "content": "Be exact."},
        {"role": "user", "content": [{"type": "text", "text": "3 +"},
                                     {"type": "text", "text": "4"}]},
        {"role": "assistant", "content": None, "tool_calls": call},
        {"role": "tool", "tool_call_id": "c1", "content": "7"},
    ], "tools": [{"type": "function", "function": ADD}]})
    assert parsed.max_tokens == 9
    system, user, assistant, tool = parsed.messages
    assert system.role == "system" and system.content.startswith("Be exact.\n\n" + TOOLS_HEADER)
    assert json.loads(system.content.splitlines()[-1]) == ADD
    assert user == ChatMessage("user", "3 +\n4")
    assert assistant == ChatMessage("assistant", "", (ToolCall("add", {"a": 3}),), ("c1",))
    assert tool == ChatMessage("tool", "7")
    assert [t.name for t in parsed.tools] == ["add"] and parsed.tool_choice == "auto"


def test_responses_input_items_and_instructions() -> None:
    parsed = parse_responses({"instructions": "Be exact.", "max_output_tokens": 5, "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "3 + 4?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "t"}]},
        {"type": "function_call", "name": "add", "arguments": "{\"a\": 3}", "call_id": "c"},
        {"type": "function_call_output", "call_id": "c", "output": "7"},
    ], "tools": [{"type": "function", **ADD}]})
    assert [m.role for m in parsed.messages] == ["system", "user", "assistant", "tool"]
    assert TOOLS_HEADER in parsed.messages[0].content and parsed.max_tokens == 5
    assert parsed.messages[2].tool_calls == (ToolCall("add", {"a": 3}),)
    assert parsed.messages[2].call_ids == ("c",)
    assert parse_responses({"input": "hi"}).messages == (ChatMessage("user", "hi"),)


def test_anthropic_blocks_tools_and_system() -> None:
    parsed = parse_anthropic_messages({"max_tokens": 7, "system": "Be exact.", "messages": [
        {"role": "user", "content": "3 + 4?"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t", "name": "add", "input": {"a": 3}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                      "content": [{"type": "text", "text": "7"}]}]},
    ], "tools": [{"name": "add", "input_schema": {"type": "object"}}]})
    assert [m.role for m in parsed.messages] == ["system", "user", "assistant", "user"]
    assert parsed.messages[2].tool_calls == (ToolCall("add", {"a": 3}),)
    assert parsed.messages[2].call_ids == ("t",)
    assert parsed.messages[3].content == "7"
    assert parsed.system_prompt is not None and TOOLS_HEADER in parsed.system_prompt


@pytest.mark.parametrize(("parse", "body", "param"), [
    (parse_chat_completions, {"messages": []}, "messages"),
    (parse_chat_completions, {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0]"),
    (parse_chat_completions, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
     "max_completion_tokens"),
    (parse_chat_completions, {"messages": [{"role": "user", "content": "x"}],
                              "temperature": -1}, "temperature"),
    (parse_chat_completions, {"messages": [{"role": "user", "content": "x"}], "stop": [""]},
     "stop"),
    (parse_chat_completions, {"messages": [{"role": "user", "content": "x"}],
                              "top_logprobs": 2}, "top_logprobs"),
    (parse_chat_completions, {"messages": [{"role": "user", "content": "x"}],
                              "response_format": {"type": "json_schema"}}, "response_format"),
    (parse_chat_completions, {"messages": [{"role": "user", "content": "x"}],
                              "tool_choice": "required"}, "tool_choice"),
    (parse_chat_completions, {"messages": [{"role": "user", "content": "x"}],
                              "tools": [{"type": "function", "function": ADD}],
                              "tool_choice": {"type": "function", "function": {"name": "mul"}}},
     "tool_choice"),
    (parse_chat_completions, {"messages": [{"role": "assistant", "tool_calls": [
        {"id": "c", "function": {"name": "add", "arguments": "{"}}]}]},
     "messages[0].tool_calls[0]"),
    (parse_responses, {"input": [{"type": "computer_call"}]}, "input[0]"),
    (parse_responses, {"input": "x", "text": {"format": {"type": "json_schema"}}},
     "text.format"),
    (parse_anthropic_messages, {"max_tokens": 5, "messages": [{"role": "system",
                                                               "content": "x"}]}, "messages[0]"),
    (parse_anthropic_messages, {"max_tokens": 5, "tools": "add",
                                "messages": [{"role": "user", "content": "x"}]}, "tools"),
])
def test_refusals_name_the_field(parse: object, body: dict[str, object], param: str) -> None:
    with pytest.raises(RequestShapeError) as refused:
        parse(body)  # type: ignore[operator]
    assert refused.value.param == param


def test_a_cut_answer_says_so_in_each_shape() -> None:
    request = parse_responses({"input": "x"})
    cut = Completion("partial", "length", prompt_tokens=3, completion_tokens=4, kind="main",
                     call_index=0, response_id="resp_1")
    body = responses_body(request, cut)
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert anthropic_message_body(request, cut)["stop_reason"] == "max_tokens"
