"""An inference server is made to load a checkpoint before serving it, and never serves a
stale policy under a new id (triloop's server, through vLLM's runtime-loading endpoints)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from execution_loop.inference.base import InferenceResponseError
from execution_loop.inference.openai_backend import (
    OpenAICompatiblePolicyClient,
    ServedWeightsMismatch,
)
from execution_loop.inference.torch_backend import TorchPolicyClient
from tests.factories_execution import weights_variant
from tests.model_servers import serving
from triloop.weights import WeightsIntegrityError, safetensors_digest

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def new_checkpoint(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint directory the server was not started with."""
    return weights_variant(tiny_model_dir, tmp_path_factory.mktemp("ckpt"))


def _client(url: str, model_dir: Path) -> OpenAICompatiblePolicyClient:
    checkpoint = safetensors_digest(model_dir)
    return OpenAICompatiblePolicyClient(url, checkpoint, model_dir, checkpoint_id=checkpoint,
                                        timeout=60)


def test_the_server_loads_a_new_checkpoint_before_the_first_request(
    tiny_model_dir: Path, new_checkpoint: Path
) -> None:
    checkpoint = safetensors_digest(new_checkpoint)
    with serving(tiny_model_dir, "base", runtime_loading=True) as url:
        client = _client(url, new_checkpoint)
        assert checkpoint not in [c["id"] for c in client.served_models()]
        card = client.ensure_served(new_checkpoint)
        assert (card["id"], card["weights_sha256"], card["root"]) == (
            checkpoint, checkpoint, str(new_checkpoint))
        assert client.ensure_served(new_checkpoint) == card  # held: no second load
        prompt = list(client.tokenizer().encode("Map: S F F G", add_special_tokens=False))
        remote = client.generate(prompt, max_new_tokens=6, temperature=1.0, seed=5)
        local = TorchPolicyClient(new_checkpoint, device="cpu").sample(
            prompt, max_new_tokens=6, temperature=1.0, seed=5)
        assert remote.token_ids == local.token_ids
        assert remote.logprobs == pytest.approx(local.logprobs, abs=2.0**-13)
        client.close()


def test_a_server_without_runtime_loading_refuses_and_nothing_is_sent(
    tiny_model_dir: Path, new_checkpoint: Path
) -> None:
    with serving(tiny_model_dir, "base", runtime_loading=False) as url:
        client = _client(url, new_checkpoint)
        with pytest.raises(ServedWeightsMismatch, match="refused to load it .HTTP 404"):
            client.ensure_served(new_checkpoint)
        client.close()


def test_a_stale_policy_under_the_new_id_is_refused(
    tiny_model_dir: Path, new_checkpoint: Path
) -> None:
    """A server started with the old weights but named as the new checkpoint."""
    checkpoint = safetensors_digest(new_checkpoint)
    with serving(tiny_model_dir, checkpoint, runtime_loading=True) as url:
        client = _client(url, new_checkpoint)
        with pytest.raises(ServedWeightsMismatch, match="weights that hash to") as refused:
            client.ensure_served(new_checkpoint)
        # The execution loop handles it as any weights refusal: audited, not retried.
        assert isinstance(refused.value, WeightsIntegrityError)
        assert safetensors_digest(tiny_model_dir) in str(refused.value)
        client.close()


def test_the_server_refuses_to_load_weights_under_another_checkpoints_id(
    tiny_model_dir: Path, new_checkpoint: Path
) -> None:
    with serving(tiny_model_dir, "base", runtime_loading=True) as url:
        answer = httpx.post(f"{url}/v1/load_lora_adapter", timeout=60, json={
            "lora_name": safetensors_digest(new_checkpoint), "lora_path": str(tiny_model_dir)})
        assert answer.status_code == 400
        assert "its weights hash to" in answer.json()["error"]["message"]
        listed = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
        assert [c["id"] for c in listed] == ["base"]
        assert httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "nope"},
                          timeout=10).status_code == 404


def test_a_completion_answered_by_another_model_is_refused(new_checkpoint: Path) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        del request
        body: dict[str, Any] = {"model": "someone-else", "choices": [{
            "token_ids": [5], "finish_reason": "length",
            "logprobs": {"token_logprobs": [-0.1], "tokens": ["token_id:5"]}}]}
        return httpx.Response(200, json=body)

    checkpoint = safetensors_digest(new_checkpoint)
    client = OpenAICompatiblePolicyClient("http://server", checkpoint, new_checkpoint,
                                          transport=httpx.MockTransport(answer))
    with pytest.raises(InferenceResponseError, match="answered by 'someone-else'"):
        client.generate([1, 2], max_new_tokens=1, temperature=1.0, seed=0)


def test_the_server_holds_at_most_max_loaded_checkpoints(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from execution_loop.inference.served_models import LoadRefused, ServedModels

    models = ServedModels(TorchPolicyClient(tiny_model_dir, device="cpu"), "base", device="cpu",
                          max_loaded=2)
    variants = [weights_variant(tiny_model_dir, tmp_path) for _ in range(3)]
    names = [safetensors_digest(v) for v in variants]
    for name, variant in zip(names, variants, strict=True):
        models.load(name, variant)
    # The least recently used one was unloaded; the start-up model always stays.
    assert [c["id"] for c in models.cards()] == ["base", names[1], names[2]]
    with pytest.raises(LoadRefused, match="already been loaded"):
        models.load(names[2], variants[2])
    models.unload(names[1])
    assert models.get(names[1]) is None and models.get("base") is not None
