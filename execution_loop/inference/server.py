"""triloop's small OpenAI-compatible model server for a local Hugging Face checkpoint.

It speaks the subset of vLLM's ``/v1/completions`` that token-level rollouts use, with
vLLM's field names and shapes (token-id prompts, ``logprobs``, ``return_token_ids``,
``return_tokens_as_token_ids``, ``stop_token_ids``, ``seed``; ``choices[0].token_ids``,
``logprobs.tokens``/``token_logprobs``, ``finish_reason``/``stop_reason``; errors as
``{"error": {"message", "type", "param", "code"}}``), plus ``/v1/models`` and ``/health``.
Sampling is ``TorchPolicyClient.sample``, so logprobs are those of the sampling
distribution, as vLLM reports with ``--logprobs-mode processed_logprobs``. Options it
does not implement (streaming, n > 1, echo, stop strings, top-p/top-k) are refused with
400 rather than ignored.

Run: ``python -m execution_loop.inference.server --model DIR --port 8000``.
"""

from __future__ import annotations

import argparse
import time
import uuid
from http import HTTPStatus
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from execution_loop.inference.base import PromptTooLongError
from execution_loop.inference.torch_backend import Sample, TorchPolicyClient

MAX_LOGPROBS = 20  # vLLM's default --max-logprobs


class CompletionRequest(BaseModel):
    """The fields of vLLM's CompletionRequest this server reads (others are ignored)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    prompt: list[int] | list[list[int]] | str | list[str] | None = None
    max_tokens: int | None = 16
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    n: int = 1
    stream: bool | None = False
    echo: bool | None = False
    seed: int | None = None
    logprobs: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = Field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    add_special_tokens: bool = True
    return_tokens_as_token_ids: bool | None = None
    return_token_ids: bool | None = None


class RequestRefused(Exception):
    """A request this server cannot serve; becomes a vLLM-shaped error response."""

    def __init__(self, message: str, *, status: HTTPStatus = HTTPStatus.BAD_REQUEST) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


_ERROR_TYPES = {
    HTTPStatus.BAD_REQUEST: "BadRequestError",
    HTTPStatus.NOT_FOUND: "NotFoundError",
}


def error_response(message: str, status: HTTPStatus, param: str | None = None) -> JSONResponse:
    """An error in vLLM's current shape."""
    error_type = _ERROR_TYPES.get(status, "InternalServerError")
    body = {"error": {"message": message, "type": error_type, "param": param, "code": status}}
    return JSONResponse(body, status_code=status)


def _refuse_unsupported(request: CompletionRequest) -> None:
    unsupported = {
        "stream": bool(request.stream),
        "n": request.n != 1,
        "echo": bool(request.echo),
        "stop": bool(request.stop),
        "top_p": request.top_p not in (None, 1.0),
        "top_k": request.top_k not in (None, 0, -1),
        "min_tokens": request.min_tokens > 0,
    }
    for name, refused in unsupported.items():
        if refused:
            raise RequestRefused(f"'{name}' with this value is not supported by triloop's server")
    if request.logprobs is not None and not 0 <= request.logprobs <= MAX_LOGPROBS:
        raise RequestRefused(f"logprobs must be between 0 and {MAX_LOGPROBS}")
    if request.max_tokens is not None and request.max_tokens < 1:
        raise RequestRefused("max_tokens must be at least 1")
    if request.temperature is not None and request.temperature < 0:
        raise RequestRefused("temperature must be >= 0")


class CompletionService:
    """Turns completion requests into samples from one checkpoint."""

    def __init__(self, client: TorchPolicyClient, served_model_name: str) -> None:
        self.client = client
        self.served_model_name = served_model_name

    def prompt_ids(self, request: CompletionRequest) -> list[int]:
        """The request's prompt as token ids (strings are tokenized, ids taken as sent)."""
        prompt: Any = request.prompt
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        if isinstance(prompt, str):
            tokenizer = self.client.tokenizer()
            return list(tokenizer(prompt, add_special_tokens=request.add_special_tokens).input_ids)
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return [int(t) for t in prompt]
        if not prompt:
            raise RequestRefused("Either prompt or prompt_embeds must be provided and non-empty.")
        raise RequestRefused("only one prompt per request is supported by triloop's server")

    def complete(self, request: CompletionRequest) -> dict[str, Any]:
        """Sample and build the response body."""
        if request.model is not None and request.model != self.served_model_name:
            raise RequestRefused(
                f"The model `{request.model}` does not exist.", status=HTTPStatus.NOT_FOUND
            )
        _refuse_unsupported(request)
        prompt_ids = self.prompt_ids(request)
        try:
            sample = self.client.sample(
                prompt_ids,
                max_new_tokens=request.max_tokens or 16,
                temperature=1.0 if request.temperature is None else request.temperature,
                seed=request.seed,
                stop_token_ids=request.stop_token_ids or (),
                ignore_eos=request.ignore_eos,
                top_logprobs=request.logprobs or 0,
            )
        except (PromptTooLongError, ValueError) as exc:
            raise RequestRefused(str(exc)) from exc
        tokenizer = self.client.tokenizer()
        text = tokenizer.decode(sample.token_ids, skip_special_tokens=request.skip_special_tokens)
        choice = {
            "index": 0,
            "text": text,
            "logprobs": self._logprobs(request, sample) if request.logprobs is not None else None,
            "finish_reason": sample.finish_reason,
            "stop_reason": sample.stop_reason,
            "token_ids": sample.token_ids if request.return_token_ids else None,
            "prompt_logprobs": None,
            "prompt_token_ids": prompt_ids if request.return_token_ids else None,
        }
        completion_tokens = len(sample.token_ids)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.served_model_name,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": completion_tokens,
                "total_tokens": len(prompt_ids) + completion_tokens,
            },
        }

    def _token_string(self, token_id: int, as_id: bool) -> str:
        if as_id:
            return f"token_id:{token_id}"
        return str(self.client.tokenizer().decode([token_id]))

    def _logprobs(self, request: CompletionRequest, sample: Sample) -> dict[str, Any]:
        """vLLM's CompletionLogProbs: the sampled token first, then the top alternatives."""
        as_id = bool(request.return_tokens_as_token_ids)
        wanted = request.logprobs or 0
        tokens: list[str] = []
        offsets: list[int] = []
        top: list[dict[str, float]] = []
        offset = 0
        for i, (token_id, logprob) in enumerate(
            zip(sample.token_ids, sample.logprobs, strict=True)
        ):
            token = self._token_string(token_id, as_id)
            entries = {token: max(logprob, -9999.0)}
            alternatives = sample.top_logprobs[i][:wanted] if wanted else []
            for alt_id, alt_logprob in alternatives:
                entries.setdefault(self._token_string(alt_id, as_id), max(alt_logprob, -9999.0))
            tokens.append(token)
            offsets.append(offset)
            offset += len(token)
            top.append(entries)
        return {
            "text_offset": offsets,
            "token_logprobs": [max(lp, -9999.0) for lp in sample.logprobs],
            "tokens": tokens,
            "top_logprobs": top,
        }


def create_app(
    model_dir: Path | str,
    *,
    served_model_name: str | None = None,
    device: str | None = None,
    client: TorchPolicyClient | None = None,
) -> FastAPI:
    """Build the app serving ``model_dir`` (or an already loaded ``client``)."""
    policy = client or TorchPolicyClient(model_dir, device=device)
    service = CompletionService(policy, served_model_name or str(model_dir))
    app = FastAPI(title="triloop model server")

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return error_response(str(first.get("msg", exc)), HTTPStatus.BAD_REQUEST, param)

    @app.exception_handler(RequestRefused)
    async def _refused(_: Request, exc: RequestRefused) -> JSONResponse:
        return error_response(exc.message, exc.status)

    @app.get("/health")
    def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        card = {
            "id": service.served_model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "triloop",
            "root": str(policy.model_dir),
            "parent": None,
            "max_model_len": policy.max_model_len,
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    def completions(request: CompletionRequest) -> dict[str, Any]:
        return service.complete(request)

    return app


def main(argv: list[str] | None = None) -> None:
    """Parse the command line and serve until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="Hugging Face checkpoint directory")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default=None, help="defaults to --model")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: best)")
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    app = create_app(args.model, served_model_name=args.served_model_name, device=args.device)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
