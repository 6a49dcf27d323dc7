"""Stand-ins for the gateway's tests: a scripted policy (the tests are about the gateway,
the harness and the record, not about sampling)."""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from execution_loop.inference.base import (
    FINISH_LENGTH,
    FINISH_STOP,
    Generation,
    InferenceServerError,
    decode_action,
)


class ScriptedPolicy:
    """Answers each call with the next scripted text (ids + end-of-turn), logprob -0.25.

    A call whose prompt is the last new prompt plus part of its answer (a streamed answer
    sampled in chunks) continues that answer instead; ``prompts`` holds the new prompts."""

    checkpoint_id = "scripted"

    def __init__(self, tokenizer: PreTrainedTokenizerBase, script: Sequence[str]) -> None:
        self._tokenizer = tokenizer
        self._script = list(script)
        self.prompts: list[list[int]] = []
        self.temperatures: list[float] = []
        self.fail = False
        self._open: tuple[list[int], list[int]] | None = None  # last new prompt, its answer

    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tokenizer

    def generate(self, prompt_token_ids: list[int], *, max_new_tokens: int, temperature: float,
                 seed: int | None, stop_token_ids: Sequence[int] = ()) -> Generation:
        if self.fail:
            raise InferenceServerError("http://vllm", "unreachable")
        ids = self._continued(prompt_token_ids)
        if ids is None:
            self.prompts.append(list(prompt_token_ids))
            self.temperatures.append(temperature)
            text = self._script.pop(0) if self._script else "done"
            ids = [*self._tokenizer(text, add_special_tokens=False).input_ids,
                   self._tokenizer.eos_token_id]
            self._open = (list(prompt_token_ids), ids)
        ids = ids[:max_new_tokens]
        finish = FINISH_STOP if ids[-1] == self._tokenizer.eos_token_id else FINISH_LENGTH
        return Generation(ids, [-0.25] * len(ids), decode_action(self._tokenizer, ids), finish)

    def _continued(self, prompt: list[int]) -> list[int] | None:
        """The rest of the open answer, when the prompt is its prompt plus part of it."""
        if self._open is None:
            return None
        first, answer = self._open
        done = len(prompt) - len(first)
        if 0 < done < len(answer) and prompt[: len(first)] == first and (
                prompt[len(first):] == answer[:done]):
            return answer[done:]
        return None
