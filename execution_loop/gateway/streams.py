"""A streamed answer as each API's server-sent events, written as the tokens are sampled.

The session calls ``begin`` once the request passed its checks and ``text`` as each
chunk of the answer is sampled (see ``sampling``); ``finish`` writes what the finished
answer adds (the rest of its text, its tool calls, why it ended) and ``fail`` an error
that came after the stream had begun, in the API's own error event. The event
sequences are the APIs' own, so the official SDKs' stream helpers accumulate them:

- Chat Completions: ``chat.completion.chunk`` deltas (role, content, ``tool_calls``,
  ``logprobs``), a last chunk with ``finish_reason`` and ``usage``, then ``[DONE]``;
- Responses: ``response.created``, ``response.in_progress``, per output item
  ``output_item.added``, ``content_part.added`` / ``output_text.delta`` /
  ``output_text.done`` / ``content_part.done`` (a message) or
  ``function_call_arguments.delta`` / ``.done`` (a call), ``output_item.done``, then
  ``response.completed``; every event has its ``sequence_number``;
- Messages: ``message_start``, per block ``content_block_start`` / ``_delta`` /
  ``_stop`` (``text_delta`` or ``input_json_delta``), ``message_delta``, ``message_stop``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from execution_loop.gateway import api_bodies
from execution_loop.gateway.api_shapes import (
    CHAT_COMPLETIONS,
    RESPONSES,
    Completion,
    ModelRequest,
)

Write = Callable[[bytes], None]


def sse(name: str | None, data: dict[str, Any] | str) -> bytes:
    """One server-sent event."""
    head = f"event: {name}\n" if name else ""
    payload = data if isinstance(data, str) else json.dumps(data)
    return f"{head}data: {payload}\n\n".encode()


class AnswerEvents:
    """One streamed answer: ``begin``, ``text``..., then ``finish`` or ``fail``."""

    def __init__(self, api: str, request: ModelRequest, write: Write,
                 start: Callable[[], None]) -> None:
        self.api, self.request = api, request
        self._write, self._start = write, start
        self.started = False
        self.response_id = ""
        self._prompt_tokens = 0
        self._shown = ""
        self._text_open = False
        self._sequence = 0

    # --- what the session calls -----------------------------------------------------
    def begin(self, response_id: str, prompt_tokens: int) -> None:
        """Send the head of the stream."""
        self._start()
        self.started, self.response_id, self._prompt_tokens = True, response_id, prompt_tokens
        if self.api == CHAT_COMPLETIONS:
            self._chunk({"role": "assistant", "content": ""})
        elif self.api == RESPONSES:
            head = self._response_head()
            self._event("response.created", {"response": head})
            self._event("response.in_progress", {"response": head})
        else:
            self._event("message_start", {"message": {
                "id": response_id, "type": "message", "role": "assistant",
                "model": self.request.model, "content": [], "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": prompt_tokens, "output_tokens": 0}}})

    def text(self, delta: str) -> None:
        """Send more of the answer's text."""
        if not delta:
            return
        self._open_text()
        self._shown += delta
        if self.api == CHAT_COMPLETIONS:
            self._chunk({"content": delta})
        elif self.api == RESPONSES:
            self._event("response.output_text.delta", {
                "item_id": self._message_id(), "output_index": 0, "content_index": 0,
                "delta": delta, "logprobs": []})
        else:
            self._event("content_block_delta", {"index": 0, "delta": {
                "type": "text_delta", "text": delta}})

    # --- what the server calls ------------------------------------------------------
    def finish(self, done: Completion, body: dict[str, Any]) -> None:
        """Send the rest of the answer and its end."""
        has_text = bool(done.text) or not done.tool_calls
        rest = done.text[len(self._shown):] if done.text.startswith(self._shown) else ""
        if has_text:
            self._open_text()
            self.text(rest)
        {CHAT_COMPLETIONS: self._finish_chat, RESPONSES: self._finish_responses}.get(
            self.api, self._finish_messages)(done, body, has_text)

    def fail(self, status: int, message: str, *, kind: str, code: str | None) -> None:
        """An error after the stream began, as the API's error event."""
        error = api_bodies.error_body(self.api, message, status=status, kind=kind, code=code)
        if self.api == CHAT_COMPLETIONS:
            self._write(sse(None, error))
        elif self.api == RESPONSES:
            self._event("error", {"code": code, "message": message, "param": None})
        else:
            self._write(sse("error", error))

    # --- the APIs' sequences ----------------------------------------------------------
    def _finish_chat(self, done: Completion, body: dict[str, Any], _: bool) -> None:
        if done.tool_calls:
            calls = api_bodies.chat_tool_calls(done)
            self._chunk({"tool_calls": [{"index": k, **c} for k, c in enumerate(calls)]})
        choice = body["choices"][0]
        self._chunk({}, finish_reason=done.finish_reason, logprobs=choice["logprobs"],
                    usage=body["usage"])
        self._write(b"data: [DONE]\n\n")

    def _finish_responses(self, done: Completion, body: dict[str, Any], has_text: bool) -> None:
        output = body["output"]
        if has_text:
            item = output[0]
            part = item["content"][0]
            self._event("response.output_text.done", {
                "item_id": item["id"], "output_index": 0, "content_index": 0,
                "text": done.text, "logprobs": part.get("logprobs", [])})
            self._event("response.content_part.done", {
                "item_id": item["id"], "output_index": 0, "content_index": 0, "part": part})
            self._event("response.output_item.done", {"output_index": 0, "item": item})
        for index, item in enumerate(output[1:] if has_text else output, start=int(has_text)):
            self._event("response.output_item.added", {
                "output_index": index, "item": item | {"arguments": "", "status": "in_progress"}})
            self._event("response.function_call_arguments.delta", {
                "item_id": item["id"], "output_index": index, "delta": item["arguments"]})
            self._event("response.function_call_arguments.done", {
                "item_id": item["id"], "output_index": index, "name": item["name"],
                "arguments": item["arguments"]})
            self._event("response.output_item.done", {"output_index": index, "item": item})
        self._event("response.completed", {"response": body})

    def _finish_messages(self, done: Completion, body: dict[str, Any], has_text: bool) -> None:
        if has_text:
            self._event("content_block_stop", {"index": 0})
        for index, block in enumerate(body["content"][int(has_text):], start=int(has_text)):
            self._event("content_block_start", {"index": index, "content_block": block | {
                "input": {}}})
            self._event("content_block_delta", {"index": index, "delta": {
                "type": "input_json_delta", "partial_json": json.dumps(block["input"])}})
            self._event("content_block_stop", {"index": index})
        self._event("message_delta", {
            "delta": {"stop_reason": body["stop_reason"], "stop_sequence": body["stop_sequence"]},
            "usage": {"output_tokens": done.completion_tokens}})
        self._event("message_stop", {})

    # --- pieces ---------------------------------------------------------------------
    def _open_text(self) -> None:
        if self._text_open:
            return
        self._text_open = True
        if self.api == RESPONSES:
            self._event("response.output_item.added", {"output_index": 0, "item": {
                "type": "message", "id": self._message_id(), "role": "assistant",
                "status": "in_progress", "content": []}})
            self._event("response.content_part.added", {
                "item_id": self._message_id(), "output_index": 0, "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}})
        elif self.api != CHAT_COMPLETIONS:
            self._event("content_block_start", {"index": 0, "content_block": {
                "type": "text", "text": ""}})

    def _message_id(self) -> str:
        return "msg_" + self.response_id.removeprefix("resp_")

    def _response_head(self) -> dict[str, Any]:
        return {"id": self.response_id, "object": "response", "created_at": int(time.time()),
                "model": self.request.model, "status": "in_progress", "output": [],
                "parallel_tool_calls": True, "tool_choice": self.request.tool_choice,
                "tools": [], "previous_response_id": self.request.previous_response_id}

    def _chunk(self, delta: dict[str, Any], *, finish_reason: str | None = None,
               logprobs: Any = None, usage: dict[str, int] | None = None) -> None:
        chunk: dict[str, Any] = {
            "id": self.response_id, "object": "chat.completion.chunk",
            "created": int(time.time()), "model": self.request.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs,
                         "finish_reason": finish_reason}]}
        if usage is not None:
            chunk["usage"] = usage
        self._write(sse(None, chunk))

    def _event(self, name: str, data: dict[str, Any]) -> None:
        if self.api == RESPONSES:
            data = {"type": name, "sequence_number": self._sequence, **data}
            self._sequence += 1
        else:
            data = {"type": name, **data}
        self._write(sse(name, data))
