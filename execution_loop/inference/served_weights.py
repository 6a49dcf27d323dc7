"""What the worker raises when an inference server does not serve a checkpoint's weights.

Shared by both ways of making a server hold a checkpoint: runtime LoRA loading
(``openai_backend``) and full-weight reload (``full_weights``).
"""

from __future__ import annotations

from pathlib import Path

import httpx

from triloop.weights import WeightsIntegrityError

LORA_HINT = (
    "Start the server with runtime loading (vLLM: VLLM_ALLOW_RUNTIME_LORA_UPDATING=True "
    "--enable-lora) on storage that holds {model_dir}, or serve the checkpoint under its id"
)
FULL_HINT = (
    "Start the server in dev mode (vLLM: VLLM_SERVER_DEV_MODE=1, on a private network) on "
    "storage that holds {model_dir}, and give each checkpoint served at once its own server"
)


class ServedWeightsMismatch(WeightsIntegrityError):
    """The inference server does not serve the checkpoint's weights under its id."""

    def __init__(self, checkpoint_id: str, model_dir: Path, server: str, problem: str,
                 *, hint: str = LORA_HINT) -> None:
        super().__init__(checkpoint_id, model_dir, f"inference server {server}: {problem}")
        self.server = server
        self.args = (
            f"checkpoint {checkpoint_id} refused: the inference server {server} {problem}; "
            f"nothing it answers is used. {hint.format(model_dir=model_dir)}",
        )

    def __str__(self) -> str:
        return str(self.args[0])


def error_message(response: httpx.Response) -> str:
    """Read vLLM's error body: ``{"error": {"message": ...}}``, the older flat form, or
    FastAPI's ``{"detail": ...}`` (vLLM's dev-mode routes)."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or response.reason_phrase
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        if isinstance(error, str):
            return error
        if "message" in body:
            return str(body["message"])
        if "detail" in body:
            return str(body["detail"])
    return str(body)[:500]
