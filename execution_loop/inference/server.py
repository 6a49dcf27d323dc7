"""triloop's small OpenAI-compatible model server for a local Hugging Face checkpoint.

It speaks the subset of vLLM's ``/v1/completions`` that token-level rollouts use, with
vLLM's field names and shapes (token-id prompts, ``logprobs``, ``return_token_ids``,
``return_tokens_as_token_ids``, ``stop_token_ids``, ``seed``; ``choices[0].token_ids``,
``logprobs.tokens``/``token_logprobs``, ``finish_reason``/``stop_reason``; errors as
``{"error": {"message", "type", "param", "code"}}``), plus ``/v1/models`` and ``/health``.

New checkpoints are loaded at run time through vLLM's documented runtime-loading endpoints,
``POST /v1/load_lora_adapter`` (``{"lora_name", "lora_path"}``) and
``POST /v1/unload_lora_adapter`` (``{"lora_name"}``), which exist only when the server is
started with ``--allow-runtime-loading`` (vLLM: ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``
and ``--enable-lora``). Here ``lora_path`` may be a full checkpoint directory. Every served
model's ``/v1/models`` card names the sha256 of the weights it actually holds
(``weights_sha256``, triloop's checkpoint id), and a load under a 64-hex name whose weights
hash to something else is refused: the server never answers under an id it does not hold.
With ``--dev-mode`` (vLLM: ``VLLM_SERVER_DEV_MODE=1``) it also serves vLLM's full-weight
reload routes (``dev_mode.py``): pause, ``collective_rpc`` ``update_config`` +
``reload_weights`` of the start-up model, the weight version, and ``/weight_info``, which
here also reports the sha256 of the weights actually served.
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
from execution_loop.inference.dev_mode import WeightReloader, attach_dev_routes
from execution_loop.inference.served_models import LoadRefused, ServedModels
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


class LoadAdapterRequest(BaseModel):
    """vLLM's LoadLoRAAdapterRequest (here the path may be a full checkpoint directory)."""

    lora_name: str
    lora_path: str


class UnloadAdapterRequest(BaseModel):
    """vLLM's UnloadLoRAAdapterRequest."""

    lora_name: str


class CompletionService:
    """Turns completion requests into samples from the served checkpoints."""

    def __init__(self, models: ServedModels) -> None:
        self.models = models

    def prompt_ids(self, request: CompletionRequest, client: TorchPolicyClient) -> list[int]:
        """The request's prompt as token ids (strings are tokenized, ids taken as sent)."""
        prompt: Any = request.prompt
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        if isinstance(prompt, str):
            tokenizer = client.tokenizer()
            return list(tokenizer(prompt, add_special_tokens=request.add_special_tokens).input_ids)
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return [int(t) for t in prompt]
        if not prompt:
            raise RequestRefused("Either prompt or prompt_embeds must be provided and non-empty.")
        raise RequestRefused("only one prompt per request is supported by triloop's server")

    def complete(self, request: CompletionRequest) -> dict[str, Any]:
        """Sample and build the response body."""
        name = request.model if request.model is not None else self.models.default_name
        served = self.models.get(name)
        if served is None:
            raise RequestRefused(
                f"The model `{request.model}` does not exist.", status=HTTPStatus.NOT_FOUND
            )
        client = served.client
        _refuse_unsupported(request)
        prompt_ids = self.prompt_ids(request, client)
        try:
            sample = client.sample(
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
        tokenizer = client.tokenizer()
        text = tokenizer.decode(sample.token_ids, skip_special_tokens=request.skip_special_tokens)
        choice = {
            "index": 0,
            "text": text,
            "logprobs": (self._logprobs(request, sample, client)
                         if request.logprobs is not None else None),
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
            "model": name,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": completion_tokens,
                "total_tokens": len(prompt_ids) + completion_tokens,
            },
        }

    @staticmethod
    def _token_string(token_id: int, as_id: bool, client: TorchPolicyClient) -> str:
        if as_id:
            return f"token_id:{token_id}"
        return str(client.tokenizer().decode([token_id]))

    def _logprobs(
        self, request: CompletionRequest, sample: Sample, client: TorchPolicyClient
    ) -> dict[str, Any]:
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
            token = self._token_string(token_id, as_id, client)
            entries = {token: max(logprob, -9999.0)}
            alternatives = sample.top_logprobs[i][:wanted] if wanted else []
            for alt_id, alt_logprob in alternatives:
                entries.setdefault(self._token_string(alt_id, as_id, client),
                                   max(alt_logprob, -9999.0))
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
    allow_runtime_loading: bool = False,
    max_loaded: int = 4,
    dev_mode: bool = False,
) -> FastAPI:
    """Build the app serving ``model_dir`` (or an already loaded ``client``)."""
    policy = client or TorchPolicyClient(model_dir, device=device)
    models = ServedModels(policy, served_model_name or str(model_dir), device=device,
                          max_loaded=max_loaded)
    service = CompletionService(models)
    reloader = WeightReloader(models)
    app = FastAPI(title="triloop model server")
    app.state.reloader = reloader  # tests read its events

    @app.exception_handler(LoadRefused)
    async def _load_refused(_: Request, exc: LoadRefused) -> JSONResponse:
        return error_response(str(exc), HTTPStatus.BAD_REQUEST)

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
    def list_models() -> dict[str, Any]:
        return {"object": "list", "data": models.cards()}

    if allow_runtime_loading:
        # Only when asked for, as vLLM registers these only with runtime updating allowed.

        @app.post("/v1/load_lora_adapter")
        def load_adapter(request: LoadAdapterRequest) -> Response:
            try:
                models.load(request.lora_name, Path(request.lora_path))
            except LoadRefused as exc:
                raise RequestRefused(str(exc)) from exc
            return Response(f"Success: LoRA adapter '{request.lora_name}' added successfully.",
                            media_type="text/plain")

        @app.post("/v1/unload_lora_adapter")
        def unload_adapter(request: UnloadAdapterRequest) -> Response:
            try:
                models.unload(request.lora_name)
            except LoadRefused as exc:
                raise RequestRefused(str(exc), status=HTTPStatus.NOT_FOUND) from exc
            return Response(f"Success: LoRA adapter '{request.lora_name}' removed successfully.",
                            media_type="text/plain")

    if dev_mode:  # vLLM: VLLM_SERVER_DEV_MODE=1
        attach_dev_routes(app, reloader)

    @app.post("/v1/completions")
    def completions(request: CompletionRequest) -> dict[str, Any]:
        with reloader.gate.admit():  # held while the server is paused for a reload
            body = service.complete(request)
        reloader.events.append(("completion", models.default().weights_sha256))
        return body

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
    parser.add_argument("--allow-runtime-loading", action="store_true",
                        help="serve /v1/load_lora_adapter and /v1/unload_lora_adapter "
                             "(vLLM: VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)")
    parser.add_argument("--max-loaded", type=int, default=4,
                        help="checkpoints held at once; the least recently used loaded one "
                             "is unloaded beyond it (vLLM: --max-loras)")
    parser.add_argument("--dev-mode", action="store_true",
                        help="serve the full-weight reload routes /pause, /resume, "
                             "/collective_rpc, /update_weight_version, /weight_info "
                             "(vLLM: VLLM_SERVER_DEV_MODE=1); unauthenticated: private "
                             "networks only")
    args = parser.parse_args(argv)
    app = create_app(args.model, served_model_name=args.served_model_name, device=args.device,
                     allow_runtime_loading=args.allow_runtime_loading,
                     max_loaded=args.max_loaded, dev_mode=args.dev_mode)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
