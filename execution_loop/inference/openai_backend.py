"""A policy client for vLLM's OpenAI-compatible ``/v1/completions`` (and triloop's own server).

The request sends the prompt as token ids and asks for token-level output with vLLM's
documented fields: ``logprobs: 0`` (the sampled token's logprob, no alternatives),
``return_token_ids: true`` (the sampled ids in ``choices[0].token_ids``) and
``return_tokens_as_token_ids: true`` (``logprobs.tokens`` as ``"token_id:123"``, which
older vLLM releases without ``return_token_ids`` still honour). So ids come back as sampled
and are never re-tokenized. Logprobs are those of the sampling distribution only when the
vLLM server runs with ``--logprobs-mode processed_logprobs``; its default (raw) reports
them before temperature, which at temperature 1.0 is the same thing.

A checkpoint the server does not hold is loaded before the first request: as a runtime LoRA
adapter named by its id (the default), or, given a ``FullWeightServer``, by reloading the
server's one model in place (``full_weights``; requests then name the served model).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from execution_loop.inference.base import (
    FINISH_LENGTH,
    FINISH_STOP,
    Generation,
    InferenceResponseError,
    InferenceServerError,
    PromptTooLongError,
    decode_action,
    validate_request,
)
from execution_loop.inference.full_weights import Audit, FullWeightServer
from execution_loop.inference.served_weights import ServedWeightsMismatch, error_message

__all__ = [
    "OpenAICompatiblePolicyClient", "ServedWeightsMismatch", "normalise_base_url",
    "parse_completion_choice",
]

TOKEN_ID_PREFIX = "token_id:"
# A request whose answer came from weights another worker loaded meanwhile is sent again;
# this many times in a row means two checkpoints contend for one full-weight server.
MOVED_ATTEMPTS = 3


def normalise_base_url(base_url: str) -> str:
    """Accept ``http://host:8000`` or ``http://host:8000/v1``; return the form without /v1."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def parse_completion_choice(server: str, body: Any) -> tuple[list[int], list[float], str]:
    """Extract (token ids, logprobs, finish reason) from a completions response body."""
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list):
        raise InferenceResponseError(server, "no 'choices' list in the body")
    if len(body["choices"]) != 1:
        raise InferenceResponseError(server, f"expected 1 choice, got {len(body['choices'])}")
    choice = body["choices"][0]
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict) or not isinstance(logprobs.get("token_logprobs"), list):
        raise InferenceResponseError(server, "choice has no logprobs.token_logprobs")
    values = logprobs["token_logprobs"]
    if any(not isinstance(v, int | float) or math.isnan(v) for v in values):
        raise InferenceResponseError(server, "a sampled token has no numeric logprob")

    from_tokens = _ids_from_tokens(server, logprobs.get("tokens"))
    token_ids = choice.get("token_ids")
    if token_ids is None:
        if from_tokens is None:
            raise InferenceResponseError(
                server,
                "neither choices[0].token_ids nor 'token_id:N' tokens were returned; the "
                "server must support return_token_ids or return_tokens_as_token_ids",
            )
        token_ids = from_tokens
    elif not isinstance(token_ids, list) or not all(isinstance(t, int) for t in token_ids):
        raise InferenceResponseError(server, "choices[0].token_ids is not a list of integers")
    elif from_tokens is not None and from_tokens != token_ids:
        raise InferenceResponseError(server, "token_ids and logprobs.tokens disagree")
    if len(values) != len(token_ids):
        raise InferenceResponseError(
            server, f"{len(token_ids)} token ids but {len(values)} logprobs"
        )
    finish_reason = choice.get("finish_reason")
    if finish_reason not in (FINISH_STOP, FINISH_LENGTH):
        raise InferenceResponseError(server, f"unexpected finish_reason {finish_reason!r}")
    return list(token_ids), [float(v) for v in values], finish_reason


def _ids_from_tokens(server: str, tokens: Any) -> list[int] | None:
    if not isinstance(tokens, list) or not tokens:
        return None
    if not all(isinstance(t, str) and t.startswith(TOKEN_ID_PREFIX) for t in tokens):
        return None
    try:
        return [int(t[len(TOKEN_ID_PREFIX) :]) for t in tokens]
    except ValueError as exc:
        raise InferenceResponseError(server, f"malformed token id string: {exc}") from exc


class OpenAICompatiblePolicyClient:
    """A ``PolicyClient`` that samples from a vLLM (or triloop) server over HTTP."""

    def __init__(
        self,
        base_url: str,
        model: str,
        tokenizer_dir: Path | str,
        *,
        timeout: float = 60.0,
        checkpoint_id: str | None = None,
        api_key: str | None = None,
        transport: httpx.BaseTransport | None = None,
        full_weights: FullWeightServer | None = None,
        audit: Audit | None = None,
    ) -> None:
        self.base_url = normalise_base_url(base_url)
        self.model = model
        self.tokenizer_dir = Path(tokenizer_dir)
        self.checkpoint_id = checkpoint_id or model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            base_url=self.base_url, timeout=timeout, headers=headers, transport=transport
        )
        self._tokenizer: PreTrainedTokenizerBase | None = None
        self._full = full_weights  # None: runtime LoRA loading under the checkpoint id
        self._audit = audit

    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The served checkpoint's tokenizer, read from a local copy of its directory."""
        if self._tokenizer is None:
            self._tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_dir)
        return self._tokenizer

    def served_models(self) -> list[dict[str, Any]]:
        """The server's ``/v1/models`` cards."""
        url = f"{self.base_url}/v1/models"
        try:
            response = self._http.get("/v1/models")
        except httpx.HTTPError as exc:
            raise InferenceServerError(url, f"unreachable: {exc}") from exc
        if response.status_code != 200:
            raise InferenceServerError(url, error_message(response),
                                       status_code=response.status_code)
        try:
            data = response.json().get("data")
        except (ValueError, AttributeError) as exc:
            raise InferenceResponseError(url, "/v1/models is not a JSON object") from exc
        if not isinstance(data, list) or not all(isinstance(c, dict) for c in data):
            raise InferenceResponseError(url, "/v1/models has no 'data' list of models")
        return data

    def ensure_served(self, model_dir: Path) -> dict[str, Any]:
        """Make the server hold this checkpoint (loading it if needed); its model card."""
        if self._full is not None:
            with self._full.holding(self.checkpoint_id, model_dir) as tag:
                return {"id": self.model, "weight_version": tag, "root": str(model_dir)}
        card = self._card()
        if card is None:
            self._load(model_dir)
            card = self._card()
        if card is None:
            raise ServedWeightsMismatch(self.checkpoint_id, model_dir, self.base_url,
                                        f"does not list '{self.model}' after loading it")
        served = card.get("weights_sha256")
        if served is not None and served != self.checkpoint_id:
            raise ServedWeightsMismatch(
                self.checkpoint_id, model_dir, self.base_url,
                f"serves '{self.model}' with weights that hash to {served}")
        return card

    def _card(self) -> dict[str, Any] | None:
        return next((c for c in self.served_models() if c.get("id") == self.model), None)

    def _load(self, model_dir: Path) -> None:
        url = f"{self.base_url}/v1/load_lora_adapter"
        body = {"lora_name": self.model, "lora_path": str(model_dir)}
        try:
            response = self._http.post("/v1/load_lora_adapter", json=body)
        except httpx.HTTPError as exc:
            raise InferenceServerError(url, f"unreachable: {exc}") from exc
        if response.status_code >= 500:  # the server's trouble: worth retrying
            raise InferenceServerError(url, error_message(response),
                                       status_code=response.status_code)
        if response.status_code != 200:
            raise ServedWeightsMismatch(
                self.checkpoint_id, model_dir, self.base_url,
                f"does not serve '{self.model}' and refused to load it "
                f"(HTTP {response.status_code}: {error_message(response)})")

    def completion_request(
        self,
        prompt_token_ids: list[int],
        *,
        max_new_tokens: int,
        temperature: float,
        seed: int | None,
        stop_token_ids: Sequence[int] = (),
    ) -> dict[str, Any]:
        """The JSON body sent to ``/v1/completions``."""
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": list(prompt_token_ids),
            "max_tokens": max_new_tokens,
            "temperature": temperature,
            "top_p": 1.0,
            "n": 1,
            "stream": False,
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": True,
            "stop_token_ids": list(stop_token_ids),
        }
        if seed is not None:
            body["seed"] = seed
        return body

    def generate(
        self,
        prompt_token_ids: list[int],
        *,
        max_new_tokens: int,
        temperature: float,
        seed: int | None,
        stop_token_ids: Sequence[int] = (),
    ) -> Generation:
        """Sample a continuation on the server; ids and logprobs come back as sampled."""
        validate_request(prompt_token_ids, max_new_tokens, temperature)
        body = self.completion_request(
            prompt_token_ids,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=seed,
            stop_token_ids=stop_token_ids,
        )
        if self._full is None:
            return self._complete(body)
        try:
            return self._complete_on_held_weights(body)
        except ServedWeightsMismatch as refused:  # found while serving: PolicyCache did not see it
            if self._audit is not None:
                self._audit(refused)
            raise

    def _complete_on_held_weights(self, body: dict[str, Any]) -> Generation:
        """Send the request while holding the server on this checkpoint; an answer is kept
        only if the server still reports the same reload's tag afterwards."""
        assert self._full is not None
        for _ in range(MOVED_ATTEMPTS):
            with self._full.holding(self.checkpoint_id, self.tokenizer_dir) as tag:
                generation = self._complete(body)
                if self._full.still_holds(tag, self.checkpoint_id, self.tokenizer_dir):
                    return generation
        raise InferenceServerError(
            self.base_url,
            f"its weights moved to another checkpoint during each of {MOVED_ATTEMPTS} "
            f"requests for {self.checkpoint_id}; the answers were discarded. A full-weight "
            "server holds one checkpoint at a time: give each checkpoint served at once its "
            "own server")

    def _complete(self, body: dict[str, Any]) -> Generation:
        url = f"{self.base_url}/v1/completions"
        try:
            response = self._http.post("/v1/completions", json=body)
        except httpx.TimeoutException as exc:
            raise InferenceServerError(url, f"no answer within the timeout ({exc})") from exc
        except httpx.HTTPError as exc:
            raise InferenceServerError(url, f"unreachable: {exc}") from exc
        if response.status_code != 200:
            message = error_message(response)
            # vLLM answers 400 "This model's maximum context length is N tokens..."; that is
            # the request's fault, not the server's, so it must not be retried.
            if response.status_code == 400 and "maximum context length" in message:
                raise PromptTooLongError(f"inference server {url}: {message}")
            raise InferenceServerError(url, message, status_code=response.status_code)
        try:
            payload = response.json()
        except ValueError as exc:
            raise InferenceResponseError(url, "the body is not JSON") from exc
        answered_by = payload.get("model") if isinstance(payload, dict) else None
        if answered_by is not None and answered_by != self.model:
            raise InferenceResponseError(
                url, f"asked for model '{self.model}', answered by '{answered_by}'")
        token_ids, logprobs, finish_reason = parse_completion_choice(url, payload)
        # Decode here rather than trust choices[0].text: the action text is then the same
        # function of the ids whichever backend sampled them.
        text = decode_action(self.tokenizer(), token_ids)
        return Generation(
            token_ids=token_ids, logprobs=logprobs, text=text, finish_reason=finish_reason
        )

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._http.close()
