"""Policy clients: exact sampled ids and behaviour logprobs, in process and over HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import uvicorn

from execution_loop.inference.base import (
    FINISH_LENGTH,
    FINISH_STOP,
    InferenceResponseError,
    InferenceServerError,
    PolicyClient,
    PromptTooLongError,
)
from execution_loop.inference.openai_backend import (
    OpenAICompatiblePolicyClient,
    normalise_base_url,
)
from execution_loop.inference.server import create_app
from execution_loop.inference.torch_backend import TorchPolicyClient, teacher_forced_logprobs
from learning_loop.tiny_model import TinyModelSpec, create_tiny_model
from triloop.devstack.processes import free_port

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)
REPO_ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A short context window so the too-long path is cheap to reach.
    spec = TinyModelSpec(max_position_embeddings=256)
    return create_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0, spec=spec)


@pytest.fixture(scope="module")
def torch_client(model_dir: Path) -> TorchPolicyClient:
    return TorchPolicyClient(model_dir, device="cpu")


@pytest.fixture(scope="module")
def prompt(torch_client: TorchPolicyClient) -> list[int]:
    tokenizer = torch_client.tokenizer()
    messages = [{"role": "user", "content": "Map: S F F G. Reply with L, R, U or D."}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False).input_ids)


@pytest.fixture(scope="module")
def server_url(model_dir: Path) -> Iterator[str]:
    app = create_app(model_dir, served_model_name="tiny", device="cpu")
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the model server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture()
def http_client(server_url: str, model_dir: Path) -> Iterator[OpenAICompatiblePolicyClient]:
    client = OpenAICompatiblePolicyClient(f"{server_url}/v1", "tiny", model_dir, timeout=30)
    yield client
    client.close()


# -- torch backend ---------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_torch_logprobs_equal_a_teacher_forced_recomputation(
    torch_client: TorchPolicyClient, prompt: list[int], temperature: float
) -> None:
    generation = torch_client.generate(prompt, max_new_tokens=24, temperature=temperature, seed=11)
    assert len(generation.token_ids) == len(generation.logprobs) > 0
    recomputed = teacher_forced_logprobs(
        torch_client.model, prompt, generation.token_ids, temperature=temperature or 1.0
    )
    assert recomputed == pytest.approx(generation.logprobs, abs=1e-4)


def test_torch_sampling_is_reproducible_for_a_seed(
    torch_client: TorchPolicyClient, prompt: list[int]
) -> None:
    first = torch_client.generate(prompt, max_new_tokens=16, temperature=1.0, seed=5)
    again = torch_client.generate(prompt, max_new_tokens=16, temperature=1.0, seed=5)
    other = torch_client.generate(prompt, max_new_tokens=16, temperature=1.0, seed=6)
    assert first == again
    assert other.token_ids != first.token_ids
    assert first.text == torch_client.tokenizer().decode(first.token_ids, skip_special_tokens=True)
    assert isinstance(torch_client, PolicyClient)


def test_torch_stops_on_a_stop_token_and_includes_it(
    torch_client: TorchPolicyClient, prompt: list[int]
) -> None:
    greedy = torch_client.generate(prompt, max_new_tokens=4, temperature=0.0, seed=None)
    stop = greedy.token_ids[0]
    stopped = torch_client.generate(
        prompt, max_new_tokens=4, temperature=0.0, seed=None, stop_token_ids=[stop]
    )
    assert stopped.token_ids == [stop]
    assert stopped.finish_reason == FINISH_STOP
    capped = torch_client.sample(prompt, max_new_tokens=3, temperature=1.0, seed=1, ignore_eos=True)
    assert len(capped.token_ids) == 3 and capped.finish_reason == FINISH_LENGTH


def test_torch_refuses_bad_requests(torch_client: TorchPolicyClient, prompt: list[int]) -> None:
    with pytest.raises(PromptTooLongError, match="maximum context length is 256"):
        torch_client.generate(prompt * 20, max_new_tokens=8, temperature=1.0, seed=0)
    with pytest.raises(ValueError, match="empty"):
        torch_client.generate([], max_new_tokens=8, temperature=1.0, seed=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        torch_client.generate(prompt, max_new_tokens=0, temperature=1.0, seed=0)
    with pytest.raises(ValueError, match="out of the vocabulary"):
        torch_client.generate([10**6], max_new_tokens=1, temperature=1.0, seed=0)
    with pytest.raises(FileNotFoundError, match="init-tiny"):
        TorchPolicyClient(REPO_ROOT / "no-such-model")


# -- OpenAI-compatible backend against triloop's server --------------------------------------


def test_http_backend_returns_the_same_ids_and_logprobs_as_torch(
    http_client: OpenAICompatiblePolicyClient, torch_client: TorchPolicyClient, prompt: list[int]
) -> None:
    for seed, temperature in [(3, 1.0), (4, 0.7)]:
        remote = http_client.generate(prompt, max_new_tokens=16, temperature=temperature, seed=seed)
        local = torch_client.generate(prompt, max_new_tokens=16, temperature=temperature, seed=seed)
        assert remote.token_ids == local.token_ids
        assert remote.logprobs == pytest.approx(local.logprobs, abs=1e-5)
        assert remote.text == local.text
        assert remote.finish_reason == local.finish_reason
    assert http_client.checkpoint_id == "tiny"
    assert isinstance(http_client, PolicyClient)


def test_server_speaks_vllms_completion_fields(server_url: str, prompt: list[int]) -> None:
    body = {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": 4,
        "temperature": 0.0,
        "logprobs": 2,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }
    response = httpx.post(f"{server_url}/v1/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    payload = response.json()
    assert payload["object"] == "text_completion" and payload["model"] == "tiny"
    choice = payload["choices"][0]
    assert choice["prompt_token_ids"] == prompt
    ids = choice["token_ids"]
    assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in ids]
    assert len(choice["logprobs"]["token_logprobs"]) == len(ids)
    # the sampled token first, then up to 2 alternatives (it is the greedy top-1 itself)
    assert all(1 <= len(top) <= 3 for top in choice["logprobs"]["top_logprobs"])
    assert payload["usage"] == {
        "prompt_tokens": len(prompt),
        "completion_tokens": len(ids),
        "total_tokens": len(prompt) + len(ids),
    }
    stopped = httpx.post(
        f"{server_url}/v1/completions",
        json={**body, "stop_token_ids": [ids[0]], "return_tokens_as_token_ids": False},
        timeout=30,
    ).json()["choices"][0]
    assert stopped["finish_reason"] == "stop" and stopped["stop_reason"] == ids[0]
    assert not stopped["logprobs"]["tokens"][0].startswith("token_id:")


def test_server_models_and_health(server_url: str) -> None:
    assert httpx.get(f"{server_url}/health", timeout=10).status_code == 200
    models = httpx.get(f"{server_url}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["tiny"]
    assert models["data"][0]["max_model_len"] == 256


@pytest.mark.parametrize(
    ("change", "status", "message"),
    [
        ({"model": "other"}, 404, "The model `other` does not exist."),
        ({"stream": True}, 400, "'stream'"),
        ({"n": 2}, 400, "'n'"),
        ({"prompt": None}, 400, "must be provided"),
        ({"prompt": [999999]}, 400, "out of the vocabulary"),
        ({"max_tokens": "many"}, 400, "integer"),
        ({"logprobs": 50}, 400, "logprobs"),
    ],
)
def test_server_refuses_bad_requests_in_vllms_error_shape(
    server_url: str, prompt: list[int], change: dict[str, Any], status: int, message: str
) -> None:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 2, **change}
    response = httpx.post(f"{server_url}/v1/completions", json=body, timeout=30)
    assert response.status_code == status
    error = response.json()["error"]
    assert message in error["message"]
    assert error["code"] == status and error["type"].endswith("Error")


def test_http_backend_maps_context_overflow_to_prompt_too_long(
    http_client: OpenAICompatiblePolicyClient, prompt: list[int]
) -> None:
    with pytest.raises(PromptTooLongError, match="maximum context length"):
        http_client.generate(prompt * 20, max_new_tokens=8, temperature=1.0, seed=0)


def test_http_backend_names_the_server_it_cannot_reach(model_dir: Path) -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    client = OpenAICompatiblePolicyClient(url, "tiny", model_dir, timeout=5)
    with pytest.raises(InferenceServerError, match=f"{url}/v1/completions: unreachable"):
        client.generate([1, 2], max_new_tokens=2, temperature=1.0, seed=0)


def test_http_backend_names_the_server_and_its_error(
    http_client: OpenAICompatiblePolicyClient, prompt: list[int], server_url: str
) -> None:
    http_client.model = "not-served"
    with pytest.raises(InferenceServerError) as raised:
        http_client.generate(prompt, max_new_tokens=2, temperature=1.0, seed=0)
    assert raised.value.status_code == 404
    assert server_url in str(raised.value) and "`not-served` does not exist" in str(raised.value)


def _client_answering(model_dir: Path, choice: dict[str, Any]) -> OpenAICompatiblePolicyClient:
    def answer(request: httpx.Request) -> httpx.Response:
        sent = json.loads(request.content)
        assert sent["logprobs"] == 0 and sent["return_token_ids"] is True
        assert sent["return_tokens_as_token_ids"] is True and sent["prompt"] == [1, 2]
        return httpx.Response(200, json={"choices": [choice]})

    return OpenAICompatiblePolicyClient(
        "http://vllm:8000", "m", model_dir, transport=httpx.MockTransport(answer)
    )


def test_http_backend_reads_ids_from_token_id_strings_when_token_ids_are_absent(
    model_dir: Path,
) -> None:
    choice = {
        "text": "ignored",
        "finish_reason": "length",
        "logprobs": {"tokens": ["token_id:40", "token_id:41"], "token_logprobs": [-1.5, -0.5]},
    }
    generation = _client_answering(model_dir, choice).generate(
        [1, 2], max_new_tokens=2, temperature=1.0, seed=0
    )
    assert generation.token_ids == [40, 41] and generation.logprobs == [-1.5, -0.5]


@pytest.mark.parametrize(
    ("choice", "problem"),
    [
        ({"finish_reason": "length"}, "no logprobs"),
        (
            {"finish_reason": "length", "logprobs": {"tokens": ["a"], "token_logprobs": [-1.0]}},
            "neither choices[0].token_ids",
        ),
        (
            {
                "finish_reason": "length",
                "token_ids": [5, 6],
                "logprobs": {"tokens": ["token_id:5", "token_id:7"], "token_logprobs": [-1, -2]},
            },
            "disagree",
        ),
        (
            {"finish_reason": "length", "token_ids": [5, 6], "logprobs": {"token_logprobs": [-1]}},
            "2 token ids but 1 logprobs",
        ),
        (
            {"finish_reason": "abort", "token_ids": [5], "logprobs": {"token_logprobs": [-1]}},
            "finish_reason",
        ),
    ],
)
def test_http_backend_rejects_responses_without_token_level_fields(
    model_dir: Path, choice: dict[str, Any], problem: str
) -> None:
    client = _client_answering(model_dir, choice)
    with pytest.raises(InferenceResponseError, match="http://vllm:8000") as raised:
        client.generate([1, 2], max_new_tokens=2, temperature=1.0, seed=0)
    assert problem in str(raised.value)


def test_base_url_with_or_without_v1() -> None:
    assert normalise_base_url("http://h:8000/v1/") == "http://h:8000"
    assert normalise_base_url("http://h:8000") == "http://h:8000"


def test_server_runs_as_a_module(model_dir: Path) -> None:
    port = _free_port()
    command = [
        sys.executable,
        "-m",
        "execution_loop.inference.server",
        "--model",
        str(model_dir),
        "--port",
        str(port),
        "--served-model-name",
        "tiny",
        "--device",
        "cpu",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline, "server did not answer /health within 60 s"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).json()
        assert models["data"][0]["id"] == "tiny"
    finally:
        process.terminate()
        process.wait(timeout=10)
