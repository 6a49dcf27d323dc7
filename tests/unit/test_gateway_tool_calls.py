"""Tool calls read off the model's text in its chat template's format, and the pieces of
a gateway answer that need no server: the forced opening of a required call, stop
sequences cut on sampled ids, and what a stream may show before the answer is done."""

from __future__ import annotations

from pathlib import Path

import pytest

from execution_loop.gateway.sampling import sample_answer, visible_text
from execution_loop.tool_calls import (
    HERMES,
    LLAMA3,
    ParsedToolCalls,
    ToolCall,
    ToolCallError,
    forced_call_prefix,
    parse_tool_calls,
    render_tool_calls,
    tool_call_format,
)
from learning_loop.tiny_model import build_tokenizer
from tests.gateway_standins import ScriptedPolicy
from triloop.contracts import ToolSpec

ADD = ToolSpec(name="add", parameters={
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"]})
LOOKUP = ToolSpec(name="lookup", parameters={
    "type": "object", "properties": {"q": {"type": "string"}}})
TOOLS = [ADD, LOOKUP]


def test_hermes_and_qwen_blocks_several_calls_and_the_text_around_them() -> None:
    text = ('Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n'
            '</tool_call>\n<tool_call>{"name": "lookup", "arguments": "{\\"q\\": \\"x\\"}"}'
            '</tool_call>')
    assert parse_tool_calls(text, TOOLS, HERMES) == ParsedToolCalls(
        "Let me add.", (ToolCall("add", {"a": 1, "b": 2}), ToolCall("lookup", {"q": "x"})))
    assert parse_tool_calls("just text", TOOLS, HERMES) == ParsedToolCalls("just text", ())


def test_llama3_json_calls_and_json_that_is_no_call() -> None:
    text = '{"name": "add", "parameters": {"a": 1, "b": 2}}; {"name": "lookup", "parameters": {}}'
    assert parse_tool_calls(text, TOOLS, LLAMA3).calls == (
        ToolCall("add", {"a": 1, "b": 2}), ToolCall("lookup", {}))
    assert parse_tool_calls('{"answer": 3}', TOOLS, LLAMA3).calls == ()
    # The format every tools text teaches is read in Llama 3 too.
    assert parse_tool_calls(render_tool_calls([ToolCall("add", {"a": 1, "b": 2})], HERMES),
                            TOOLS, LLAMA3).calls == (ToolCall("add", {"a": 1, "b": 2}),)


@pytest.mark.parametrize(("text", "reason"), [
    ('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>', "missing required"),
    ('<tool_call>{"name": "mul", "arguments": {}}</tool_call>', "no tool 'mul'"),
    ('<tool_call>{"name": "add", "arguments": {"a": 1, "b": </tool_call>', "not JSON"),
    ('<tool_call>{"name": "add", "arguments": {"a": "1", "b": 2}}</tool_call>',
     "argument a must be integer"),
])
def test_a_malformed_call_says_what_is_wrong(text: str, reason: str) -> None:
    with pytest.raises(ToolCallError, match=reason):
        parse_tool_calls(text, TOOLS, HERMES)


def test_the_format_comes_from_the_template_and_round_trips() -> None:
    assert tool_call_format("{% if m.role == 'ipython' %}<|python_tag|>{% endif %}") == LLAMA3
    assert tool_call_format("<tool_call>\n{{ tool_call | tojson }}\n</tool_call>") == HERMES
    assert tool_call_format(None) == HERMES
    for call_format in (HERMES, LLAMA3):
        calls = [ToolCall("add", {"a": 1, "b": 2})]
        assert parse_tool_calls(render_tool_calls(calls, call_format), TOOLS,
                                call_format).calls == tuple(calls)
        # What the model writes after a forced opening completes a call.
        opening = forced_call_prefix(call_format, "add")
        rest = '{"a": 1, "b": 2}}' + ("\n</tool_call>" if call_format == HERMES else "")
        assert parse_tool_calls(opening + rest, TOOLS, call_format).calls == tuple(calls)


def test_a_stop_sequence_cuts_the_sampled_ids_at_the_token_that_completes_it() -> None:
    tokenizer = build_tokenizer()
    policy = ScriptedPolicy(tokenizer, ["one two three four five"])
    prompt = tokenizer("go", add_special_tokens=False).input_ids
    answer = sample_answer(policy, prompt, budget=40, temperature=1.0, seed=1,
                           stops=["thr"])
    assert answer.text == "one two " and answer.stop_sequence == "thr"
    # The ids end with the token that completes the stop: it was sampled, so it is kept.
    assert "thr" in tokenizer.decode(answer.token_ids)
    assert "thr" not in tokenizer.decode(answer.token_ids[:-1])
    assert len(answer.logprobs) == len(answer.token_ids)


def test_a_stream_holds_back_what_may_become_a_stop_or_a_call() -> None:
    assert visible_text("I will <tool", ["<tool_call>"]) == "I will "
    assert visible_text("I will <tool_call>{", ["<tool_call>"]) == "I will "
    assert visible_text("one two th", ["three"]) == "one two "
    assert visible_text("caf\ufffd", []) == "caf"


def test_streamed_chunks_add_up_to_the_answer_sampled_whole() -> None:
    tokenizer = build_tokenizer()
    prompt = tokenizer("go", add_special_tokens=False).input_ids
    text = "one two three four five six seven eight nine ten eleven"
    whole = sample_answer(ScriptedPolicy(tokenizer, [text]), prompt, budget=60,
                          temperature=1.0, seed=1)
    shown: list[str] = []
    streamed = sample_answer(ScriptedPolicy(tokenizer, [text]), prompt, budget=60,
                             temperature=1.0, seed=1, on_text=shown.append)
    assert streamed.token_ids == whole.token_ids and streamed.text == whole.text == text
    assert len(shown) > 1 and text.startswith("".join(shown))


def test_qwen3_s_own_template_reads_as_the_hermes_format() -> None:
    template = (Path(__file__).parent.parent / "data" / "qwen3_chat_template.jinja").read_text()
    assert "<tool_call>" in template and tool_call_format(template) == HERMES
