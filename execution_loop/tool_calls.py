"""Tools as function calls: what the model is shown, how its calls are read and checked.

A contract may declare tools as JSON-schema functions (``contract.tools``). The harness
passes them to the model's chat template (``apply_chat_template(tools=...)``) when the
template renders them, and otherwise writes ``tools_system_text`` into the system
message, so every model sees them. The model calls a tool by writing

    <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>

(the Hermes/Qwen convention). ``parse_tool_call`` finds the first such block and checks
its arguments against the tool's schema: required properties, no unknown ones when
``additionalProperties`` is false, and JSON types of each. The episode runner gives a
valid call to the environment and records the call and its result on the step.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from triloop.contracts import ToolSpec

_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}


@dataclass(frozen=True)
class ToolCall:
    """A call the model wrote, checked against the declared tool."""

    name: str
    arguments: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments}

    def as_action(self) -> str:
        """The canonical text an environment without ``call_tool`` receives in ``step``."""
        return json.dumps({"tool_call": self.as_json()}, sort_keys=True)


class ToolCallError(ValueError):
    """The model tried to call a tool, but the call is malformed or does not fit its schema."""


def function_schemas(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """The tools in the shape chat templates take (OpenAI's ``{"type": "function", ...}``)."""
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in tools
    ]


def tools_system_text(tools: Sequence[ToolSpec]) -> str:
    """The tools as text, for templates that do not render ``tools`` themselves."""
    lines = [json.dumps(schema["function"], sort_keys=True) for schema in function_schemas(tools)]
    return (
        "You may call these tools, one per turn, by writing "
        '<tool_call>{"name": ..., "arguments": {...}}</tool_call>:\n' + "\n".join(lines)
    )


def _type_ok(value: Any, expected: Any) -> bool:
    names = expected if isinstance(expected, list) else [expected]
    for name in names:
        kinds = _TYPES.get(str(name))
        if kinds is None:
            return True  # a type we do not check
        if isinstance(value, bool) and name in ("integer", "number"):
            continue  # JSON's true is not a number
        if isinstance(value, kinds):
            return True
    return False


def check_arguments(tool: ToolSpec, arguments: Any) -> dict[str, Any]:
    """The arguments if they fit the tool's schema; else ``ToolCallError`` saying why."""
    if not isinstance(arguments, dict):
        raise ToolCallError(f"{tool.name}: arguments must be a JSON object")
    schema = tool.parameters
    properties: dict[str, Any] = schema.get("properties", {})
    missing = [name for name in schema.get("required", []) if name not in arguments]
    if missing:
        raise ToolCallError(f"{tool.name}: missing required argument(s) {', '.join(missing)}")
    if schema.get("additionalProperties") is False:
        extra = sorted(set(arguments) - set(properties))
        if extra:
            raise ToolCallError(f"{tool.name}: unknown argument(s) {', '.join(extra)}")
    for name, value in arguments.items():
        expected = properties.get(name, {}).get("type")
        if expected is not None and not _type_ok(value, expected):
            raise ToolCallError(f"{tool.name}: argument {name} must be {expected}")
    return arguments


def parse_tool_call(text: str, tools: Sequence[ToolSpec]) -> ToolCall | None:
    """The tool call in the model's text; None when it wrote none; ``ToolCallError`` if bad."""
    match = _CALL.search(text)
    if match is None:
        return None
    try:
        document = json.loads(match.group(1))
    except ValueError as exc:
        raise ToolCallError(f"the tool call is not JSON: {exc}") from exc
    return _checked(document, {t.name: t for t in tools})


# --- Tool calls of a black-box agent's model, in the chat template's own format ---------
# The gateway declares the agent's tools to the model and reads its calls back in the
# format the model was trained to write: Hermes and Qwen (2.5, 3) write
# ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks; Llama 3 writes a
# bare JSON object ``{"name": ..., "parameters": {...}}`` (after ``<|python_tag|>``, a
# special token the decoded text no longer holds).
HERMES, LLAMA3 = "hermes", "llama3"
_HERMES_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_HERMES_OPEN = "<tool_call>"


@dataclass(frozen=True)
class ParsedToolCalls:
    """The model's answer split into its text and the tool calls it made (maybe none)."""

    text: str  # the answer outside the calls, stripped
    calls: tuple[ToolCall, ...]


def tool_call_format(chat_template: str | None) -> str:
    """The format the model writes its calls in, read off its chat template."""
    template = chat_template or ""
    if "<|python_tag|>" in template or "ipython" in template:
        return LLAMA3
    return HERMES  # Hermes, Qwen, and the format ``tools_system_text`` teaches


def tool_markers(call_format: str) -> tuple[str, ...]:
    """Texts that open a call: a stream holds text back from where one may begin."""
    return (_HERMES_OPEN, "{") if call_format == LLAMA3 else (_HERMES_OPEN,)


def forced_call_prefix(call_format: str, name: str | None) -> str:
    """The text a call opens with, forced into the prompt when the agent requires a call
    (``name``: that tool's), so the model's first sampled token already continues one."""
    if call_format == LLAMA3:
        return '{"name": "' if name is None else f'{{"name": "{name}", "parameters": '
    if name is None:
        return '<tool_call>\n{"name": "'
    return f'<tool_call>\n{{"name": "{name}", "arguments": '


def render_tool_calls(calls: Sequence[ToolCall], call_format: str) -> str:
    """Calls as the model writes them: the text of an agent's call whose sampled ids the
    gateway does not hold (an agent may send calls it made up)."""
    if call_format == LLAMA3:
        return "; ".join(json.dumps({"name": c.name, "parameters": c.arguments}) for c in calls)
    return "\n".join(f"<tool_call>\n{json.dumps(c.as_json())}\n</tool_call>" for c in calls)


def _checked(document: Any, by_name: dict[str, ToolSpec]) -> ToolCall:
    if not isinstance(document, dict) or not isinstance(document.get("name"), str):
        raise ToolCallError('a tool call is {"name": ..., "arguments": {...}}')
    tool = by_name.get(document["name"])
    if tool is None:
        known = ", ".join(sorted(by_name)) or "none"
        raise ToolCallError(f"no tool {document['name']!r} (tools: {known})")
    arguments = document.get("arguments", document.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError as exc:
            raise ToolCallError(f"{tool.name}: the arguments are not JSON: {exc}") from exc
    return ToolCall(tool.name, check_arguments(tool, arguments))


def _llama3_documents(text: str) -> list[Any] | None:
    body = text.strip()
    if not body.startswith("{"):
        return None
    decoder, documents, at = json.JSONDecoder(), [], 0
    while at < len(body):
        try:
            document, end = decoder.raw_decode(body, at)
        except ValueError as exc:
            raise ToolCallError(f"the tool call is not JSON: {exc}") from exc
        documents.append(document)
        at = end
        while at < len(body) and body[at] in " \t\n;":
            at += 1
    return documents


def parse_tool_calls(text: str, tools: Sequence[ToolSpec], call_format: str) -> ParsedToolCalls:
    """Every call in the model's answer, each checked against its tool's schema; an answer
    without calls comes back whole as text. ``ToolCallError`` names what is wrong."""
    by_name = {t.name: t for t in tools}
    blocks = list(_HERMES_BLOCK.finditer(text))  # every format: the form the tools text teaches
    if not blocks and call_format == LLAMA3:
        documents = _llama3_documents(text)
        if not documents or not all(isinstance(d, dict) and "name" in d for d in documents):
            return ParsedToolCalls(text.strip(), ())  # not JSON, or JSON but not a call
        return ParsedToolCalls("", tuple(_checked(d, by_name) for d in documents))
    if not blocks:
        return ParsedToolCalls(text.strip(), ())
    calls = []
    for block in blocks:
        try:
            document = json.loads(block.group(1))
        except ValueError as exc:
            raise ToolCallError(f"the tool call is not JSON: {exc}") from exc
        calls.append(_checked(document, by_name))
    outside = text[: blocks[0].start()] + text[blocks[-1].end():]
    return ParsedToolCalls(outside.strip(), tuple(calls))
