"""Tools as function calls: contract section, rendering in the chat template, parsing, steps."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import pytest
from pydantic import ValidationError
from transformers import PreTrainedTokenizerBase

from execution_loop.environments.base import Outcome, StepResult
from execution_loop.episode import COMPLETED, run_episode
from execution_loop.harness import ChatHarness, Turn
from execution_loop.inference.base import Generation
from execution_loop.tool_calls import ToolCallError, parse_tool_call
from learning_loop.tiny_model import build_tokenizer
from triloop.contracts import ContextRule, EnvironmentContract, Limits, ToolSpec, canonical_form

ADD = ToolSpec(
    name="add", description="Add two integers.",
    parameters={"type": "object", "properties": {"a": {"type": "integer"},
                                                 "b": {"type": "integer"}},
                "required": ["a", "b"], "additionalProperties": False},
)
ANSWER = ToolSpec(name="answer", parameters={
    "type": "object", "properties": {"value": {"type": "integer"}}, "required": ["value"]})
TOOLS_TEMPLATE = (  # a template that renders tools itself, as Qwen's and Llama 3's do
    "{{ bos_token }}{% if tools %}<|system|>\nTOOLS:{% for t in tools %} "
    "{{ t['function']['name'] }}{% endfor %}<|end|>\n{% endif %}"
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def contract_data(**extra: Any) -> dict[str, Any]:
    return {"task": "calc", "observations": ["result"], "allowed_actions": ["answer"],
            "success_criteria": {"exact_answer": True}, "reward": {"outcome": {"success": 1.0}},
            "limits": {"max_turns": 4, "wall_time_s": 60, "max_tokens_per_turn": 64,
                       "max_total_tokens": 512}, **extra}


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return build_tokenizer()


def test_a_call_is_parsed_and_checked_against_its_schema() -> None:
    call = parse_tool_call('ok <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}'
                           "</tool_call>", [ADD])
    assert call is not None and (call.name, call.arguments) == ("add", {"a": 2, "b": 3})
    assert parse_tool_call("just text", [ADD]) is None
    for text, why in [
        ("<tool_call>{not json</tool_call>", "not JSON"),
        ('<tool_call>{"name": "mul", "arguments": {}}</tool_call>', "no tool 'mul'"),
        ('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>', "missing required"),
        ('<tool_call>{"name": "add", "arguments": {"a": 1, "b": "2"}}</tool_call>',
         "b must be integer"),
        ('<tool_call>{"name": "add", "arguments": {"a": true, "b": 2}}</tool_call>',
         "a must be integer"),
        ('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2, "c": 3}}</tool_call>',
         "unknown argument"),
        ('<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>', "JSON object"),
    ]:
        with pytest.raises(ToolCallError, match=why):
            parse_tool_call(text, [ADD])


def test_contracts_declare_tools_and_others_keep_their_identity() -> None:
    plain = EnvironmentContract.model_validate(contract_data())
    assert b'"tools"' not in canonical_form(plain, {})
    with_tools = EnvironmentContract.model_validate(contract_data(tools=[
        {"name": "add", "parameters": ADD.parameters}]))
    assert with_tools.tools is not None and with_tools.tools[0] == ADD.model_copy(
        update={"description": ""})
    assert b'"tools"' in canonical_form(with_tools, {})
    for tools, why in [
        ([{"name": "add"}, {"name": "add"}], "duplicate tool names"),
        ([{"name": "add", "parameters": {"type": "array"}}], "type: object"),
        ([{"name": "add", "parameters": {"type": "object", "required": ["x"]}}],
         "required names no property"),
        ([{"name": "no spaces"}], "name"),
    ]:
        with pytest.raises(ValidationError, match=why):
            EnvironmentContract.model_validate(contract_data(tools=tools))


def test_tools_go_into_a_template_that_renders_them(tokenizer: PreTrainedTokenizerBase) -> None:
    own = copy.deepcopy(tokenizer)
    own.chat_template = TOOLS_TEMPLATE
    harness = ChatHarness(own, tools=[ADD, ANSWER])
    prompt = own.decode(harness.prompt_token_ids(system=None, initial_observation="2+3?",
                                                 turns=[]))
    assert '"name": "add"' not in prompt  # the template rendered them, not a system message
    assert "TOOLS: add answer" in prompt
    action = own('<tool_call>{"name": "add"}</tool_call>', add_special_tokens=False).input_ids
    ids, mask = harness.conversation_token_ids_and_mask(
        system=None, initial_observation="2+3?", turns=[Turn(action, "5")])
    assert [i for i, m in zip(ids, mask, strict=True) if m] == action  # only the model's ids


def test_a_template_without_tools_gets_them_in_the_system_message(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    harness = ChatHarness(tokenizer, tools=[ADD])
    prompt = tokenizer.decode(harness.prompt_token_ids(system="Be exact.",
                                                       initial_observation="2+3?", turns=[]))
    assert "TOOLS:" not in prompt  # the template itself does not render tools
    assert prompt.index('"name": "add"') < prompt.index("Be exact.") < prompt.index("2+3?")
    assert "<tool_call>" in prompt


class Calculator:
    """Tools ``add`` and ``answer``; plain text is an invalid move."""

    def __init__(self) -> None:
        self.contract = EnvironmentContract.model_validate(contract_data(tools=[
            ADD.model_dump(), ANSWER.model_dump()]))
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.steps: list[str] = []
        self.answer: int | None = None

    def reset(self, seed: int, item: Any = None) -> str:
        return f"What is {seed} + 3? Use the tools."

    def call_tool(self, name: str, arguments: dict[str, Any]) -> StepResult:
        self.calls.append((name, arguments))
        if name == "add":
            return StepResult(str(arguments["a"] + arguments["b"]), 0.0, False, {})
        self.answer = arguments["value"]
        return StepResult("answer recorded", 0.0, True, {})

    def step(self, action: str) -> StepResult:
        self.steps.append(action)
        return StepResult("use a tool", 0.0, False, {})

    def outcome(self) -> Outcome:
        return Outcome(self.answer == 5, 1.0 if self.answer == 5 else 0.0, {})

    def state_fingerprint(self) -> str:
        return str(len(self.calls))

    def close(self) -> None:
        pass


class ScriptedPolicy:
    """Writes the given replies in order, as sampled token ids."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, replies: Sequence[str]) -> None:
        self._tokenizer, self._replies = tokenizer, list(replies)
        self.checkpoint_id = "scripted"
        self.prompts: list[list[int]] = []

    def generate(self, prompt_ids: Sequence[int], *, max_new_tokens: int, temperature: float,
                 seed: int | None = None) -> Generation:
        del max_new_tokens, temperature, seed
        self.prompts.append(list(prompt_ids))
        text = self._replies.pop(0)
        ids = self._tokenizer(text, add_special_tokens=False).input_ids
        return Generation(list(ids), [-0.1] * len(ids), text, "stop")

    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tokenizer


def test_each_call_and_its_result_is_a_step(tokenizer: PreTrainedTokenizerBase) -> None:
    env = Calculator()
    policy = ScriptedPolicy(tokenizer, [
        '<tool_call>{"name": "add", "arguments": {"a": 2, "b": "x"}}</tool_call>',
        "I think five",
        '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>',
        '<tool_call>{"name": "answer", "arguments": {"value": 5}}</tool_call>',
    ])
    record = run_episode(env, policy, seed=0, task_seed=2, limits=env.contract.limits,
                         context_rule=ContextRule())
    assert record.status == COMPLETED and record.success
    bad, text, add, answer = record.steps
    assert "b must be integer" in bad.feedback["tool_error"] and bad.observation.startswith(
        "tool call error")
    assert "tool_call" not in text.feedback and env.steps == ["I think five"]
    assert add.feedback["tool_call"] == {"name": "add", "arguments": {"a": 2, "b": 3}}
    assert add.feedback["tool_result"] == "5" and add.observation == "5"
    assert answer.feedback["tool_call"]["name"] == "answer" and answer.done
    assert env.calls == [("add", {"a": 2, "b": 3}), ("answer", {"value": 5})]  # bad call: never
    first_prompt = tokenizer.decode(policy.prompts[0])
    assert '"name": "answer"' in first_prompt  # the model was shown the tools


def test_an_environment_without_call_tool_gets_the_canonical_call(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    env = Calculator()
    env.call_tool = None  # type: ignore[assignment,method-assign]
    policy = ScriptedPolicy(tokenizer, ['<tool_call>{"name": "answer", "arguments": '
                                        '{"value": 5}}</tool_call>'] * 4)
    record = run_episode(env, policy, seed=0, task_seed=2,
                         limits=Limits(max_turns=1, wall_time_s=60, max_tokens_per_turn=64,
                                       max_total_tokens=512), context_rule=ContextRule())
    assert env.steps == ['{"tool_call": {"arguments": {"value": 5}, "name": "answer"}}']
    assert record.steps[0].feedback["tool_call"] == {"name": "answer", "arguments": {"value": 5}}
