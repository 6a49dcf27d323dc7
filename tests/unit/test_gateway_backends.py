"""The gateway in front of both configured backends: in-process torch, and the
OpenAI-compatible (vLLM) client talking to triloop's own model server.

The same agent request through either backend records the same sampled ids and
(within float tolerance) the same behaviour logprobs, and they agree with a
teacher-forced recomputation on the prompt the gateway rendered.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
import uvicorn

from execution_loop.gateway.http_server import GatewayServer
from execution_loop.gateway.session import Gateway, SessionSettings
from execution_loop.inference.base import PolicyClient
from execution_loop.inference.openai_backend import OpenAICompatiblePolicyClient
from execution_loop.inference.server import create_app
from execution_loop.inference.torch_backend import TorchPolicyClient, teacher_forced_logprobs
from learning_loop.tiny_model import TinyModelSpec, create_tiny_model
from triloop.devstack.processes import free_port

pytestmark = pytest.mark.slow
torch.set_num_threads(1)
REQUEST = {"model": "policy", "max_tokens": 12, "messages": [
    {"role": "system", "content": "Solve it."}, {"role": "user", "content": "What is 3 + 4?"}]}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = TinyModelSpec(max_position_embeddings=256)  # overflow is cheap to reach
    return create_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0, spec=spec)


@pytest.fixture(scope="module")
def torch_client(model_dir: Path) -> TorchPolicyClient:
    return TorchPolicyClient(model_dir, device="cpu")


@pytest.fixture(scope="module")
def http_client(model_dir: Path) -> Iterator[OpenAICompatiblePolicyClient]:
    port = free_port()
    app = create_app(model_dir, served_model_name="tiny", device="cpu")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline, "the model server did not start"
        time.sleep(0.05)
    client = OpenAICompatiblePolicyClient(f"http://127.0.0.1:{port}/v1", "tiny", model_dir)
    yield client
    client.close()
    server.should_exit = True
    thread.join(timeout=10)


def ask(policy: PolicyClient, body: dict[str, object]) -> tuple[httpx.Response, Gateway, str]:
    gateway = Gateway()
    session = gateway.open_session(SessionSettings(policy=policy, temperature=1.0, seed=7,
                                                   max_tokens_per_turn=16,
                                                   max_total_tokens=64))
    with GatewayServer(gateway) as server:
        answer = httpx.post(f"{server.session_url(session.id)}/v1/chat/completions", json=body,
                            timeout=60)
    return answer, gateway, session.id


def test_both_backends_record_the_same_sample(
    torch_client: TorchPolicyClient, http_client: OpenAICompatiblePolicyClient
) -> None:
    calls = []
    for policy in (torch_client, http_client):
        answer, gateway, session_id = ask(policy, REQUEST)
        assert answer.status_code == 200, answer.text
        [call] = gateway.close_session(session_id).calls
        assert answer.json()["choices"][0]["message"]["content"] == call.text
        calls.append(call)
    local, remote = calls
    assert remote.prompt_token_ids == local.prompt_token_ids
    assert remote.completion_token_ids == local.completion_token_ids
    assert remote.logprobs == pytest.approx(local.logprobs, abs=1e-5)
    # What was recorded is what the model gives those ids after that prompt.
    recomputed = teacher_forced_logprobs(torch_client.model, local.prompt_token_ids,
                                         local.completion_token_ids)
    assert local.logprobs == pytest.approx(recomputed, abs=1e-4)


@pytest.mark.parametrize("backend", ["torch", "http"])
def test_a_prompt_past_the_context_window_is_the_apis_context_error(
    backend: str, torch_client: TorchPolicyClient, http_client: OpenAICompatiblePolicyClient
) -> None:
    policy = torch_client if backend == "torch" else http_client
    long = {**REQUEST, "messages": [{"role": "user", "content": "7 + 7 " * 200}]}
    answer, gateway, session_id = ask(policy, long)
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "context_length_exceeded"
    assert "maximum context length" in answer.json()["error"]["message"]
    session = gateway.close_session(session_id)
    assert session.context_overflows == 1 and session.calls == []
    assert session.infrastructure_error is None  # the agent's to handle, not a retry


@pytest.mark.parametrize("backend", ["torch", "http"])
def test_a_streamed_answer_is_sampled_in_chunks_with_true_behaviour_logprobs(
    backend: str, torch_client: TorchPolicyClient, http_client: OpenAICompatiblePolicyClient
) -> None:
    policy = torch_client if backend == "torch" else http_client
    answer, gateway, session_id = ask(policy, {**REQUEST, "max_tokens": 16, "stream": True})
    assert answer.headers["content-type"] == "text/event-stream", answer.text
    datas = [line[6:] for line in answer.text.splitlines() if line.startswith("data: ")]
    assert datas[-1] == "[DONE]"
    text = "".join(json.loads(d)["choices"][0]["delta"].get("content") or ""
                   for d in datas[:-1])
    [call] = gateway.close_session(session_id).calls
    assert text == call.text
    # Sampled chunk by chunk, each token's logprob is still the model's given all before it.
    recomputed = teacher_forced_logprobs(torch_client.model, call.prompt_token_ids,
                                         call.completion_token_ids)
    assert call.logprobs == pytest.approx(recomputed, abs=1e-4)
    # A prompt past the window is refused before the stream begins: a plain API error.
    long = {**REQUEST, "stream": True,
            "messages": [{"role": "user", "content": "7 + 7 " * 200}]}
    refused, _, _ = ask(policy, long)
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "context_length_exceeded"
