"""Full-weight reload (vLLM dev mode) against triloop's own server over real HTTP: the worker
reloads a checkpoint before its first request, refuses a server that lies about what it
serves, and never keeps an answer given by another checkpoint's weights."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import torch

from execution_loop.inference.base import InferenceServerError
from execution_loop.inference.dev_mode import WeightReloader
from execution_loop.inference.full_weights import (
    LOADING_PREFIX,
    DevModeControl,
    FullWeightServer,
    tagged_checkpoint,
)
from execution_loop.inference.openai_backend import OpenAICompatiblePolicyClient
from execution_loop.inference.served_weights import ServedWeightsMismatch
from execution_loop.inference.server import create_app
from execution_loop.inference.torch_backend import TorchPolicyClient
from learning_loop.tiny_model import create_tiny_model
from tests.model_servers import serving_app
from triloop.weights import WeightsIntegrityError, safetensors_digest

torch.set_num_threads(1)

SERVED = "policy"  # the server's --served-model-name


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint with other weights than the one the server starts on."""
    return create_tiny_model(tmp_path_factory.mktemp("trained") / "model", seed=1)


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A third checkpoint, for two batches that want different weights."""
    return create_tiny_model(tmp_path_factory.mktemp("other") / "model", seed=2)


@contextmanager
def dev_server(model_dir: Path) -> Iterator[tuple[str, WeightReloader]]:
    app = create_app(model_dir, served_model_name=SERVED, device="cpu", dev_mode=True)
    with serving_app(app) as url:
        yield url, app.state.reloader


def _client(server: FullWeightServer, model_dir: Path,
            checkpoint: str | None = None) -> OpenAICompatiblePolicyClient:
    checkpoint = checkpoint or safetensors_digest(model_dir)
    return OpenAICompatiblePolicyClient(server.base_url, server.served_model(), model_dir,
                                        checkpoint_id=checkpoint, timeout=60,
                                        full_weights=server)


def _worker(url: str) -> FullWeightServer:
    """What one execution worker holds for the server."""
    return FullWeightServer(DevModeControl(url, timeout=60))


def _prompt(client: OpenAICompatiblePolicyClient) -> list[int]:
    return list(client.tokenizer().encode("Map: S F F G", add_special_tokens=False))


def _local(model_dir: Path, prompt: list[int], seed: int) -> list[int]:
    return TorchPolicyClient(model_dir, device="cpu").sample(
        prompt, max_new_tokens=8, temperature=1.0, seed=seed).token_ids


def _remote(client: OpenAICompatiblePolicyClient, prompt: list[int], seed: int) -> list[int]:
    return client.generate(prompt, max_new_tokens=8, temperature=1.0, seed=seed).token_ids


def _protocol(reloader: WeightReloader) -> list[str]:
    return [name for name, _ in reloader.events if name != "completion"]


def test_the_worker_reloads_the_checkpoint_before_the_first_request(
    tiny_model_dir: Path, trained: Path
) -> None:
    checkpoint = safetensors_digest(trained)
    with dev_server(tiny_model_dir) as (url, reloader):
        assert httpx.get(f"{url}/weight_info", timeout=10).json() == {
            "weight_version": None, "weights_sha256": safetensors_digest(tiny_model_dir)}
        server = _worker(url)
        client = _client(server, trained)
        card = client.ensure_served(trained)
        assert tagged_checkpoint(card["weight_version"]) == checkpoint
        # pause (wait) -> loading marker -> update_config -> reload -> reset -> tag -> resume
        assert _protocol(reloader) == ["pause", "version", "update_config", "reload_weights",
                                       "reset_prefix_cache", "version", "resume"]
        versions = [v for name, v in reloader.events if name == "version"]
        assert versions[0] == f"{LOADING_PREFIX}{card['weight_version']}"
        assert versions[1] == card["weight_version"]
        info = httpx.get(f"{url}/weight_info", timeout=10).json()
        assert info == {"weight_version": card["weight_version"], "weights_sha256": checkpoint}

        prompt = _prompt(client)
        assert _remote(client, prompt, seed=3) == _local(trained, prompt, seed=3)
        assert client.model == SERVED  # requests name the served model, not the checkpoint
        # Held: neither another request nor another worker reloads it.
        assert _remote(client, prompt, seed=4) == _local(trained, prompt, seed=4)
        second = _worker(url)
        _client(second, trained).ensure_served(trained)
        assert (server.reloads, second.reloads) == (1, 0)
        assert _protocol(reloader).count("reload_weights") == 1
        client.close()


def test_a_directory_whose_weights_do_not_hash_to_the_id_is_refused(
    tiny_model_dir: Path, trained: Path, other: Path
) -> None:
    """The worker names checkpoint X but the directory holds other weights."""
    checkpoint = safetensors_digest(trained)
    with dev_server(tiny_model_dir) as (url, _):
        client = _client(_worker(url), other, checkpoint=checkpoint)
        with pytest.raises(ServedWeightsMismatch, match="serves weights that hash to") as refused:
            client.ensure_served(other)
        assert isinstance(refused.value, WeightsIntegrityError)  # audited, never retried
        assert safetensors_digest(other) in str(refused.value)
        info = httpx.get(f"{url}/weight_info", timeout=10).json()
        # The server is resumed, and its version still says "loading": nobody adopts it.
        assert info["weight_version"].startswith(LOADING_PREFIX)
        assert httpx.get(f"{url}/is_paused", timeout=10).json() == {"is_paused": False}
        client.close()


def test_a_server_that_reports_another_version_after_the_reload_is_refused(
    tiny_model_dir: Path, trained: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with dev_server(tiny_model_dir) as (url, reloader):
        # A server that reloads but keeps reporting its old label.
        monkeypatch.setattr(reloader, "set_version", lambda version: None)
        reloader.version = "step-41"
        client = _client(_worker(url), trained)
        with pytest.raises(ServedWeightsMismatch, match="reports weight version 'step-41'"):
            client.ensure_served(trained)
        client.close()


def test_a_refused_reload_refuses_the_batch_and_resumes_the_server(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    not_a_checkpoint = tmp_path / "empty"
    not_a_checkpoint.mkdir()
    with dev_server(tiny_model_dir) as (url, reloader):
        client = _client(_worker(url), not_a_checkpoint, checkpoint="a" * 64)
        with pytest.raises(ServedWeightsMismatch, match=r"refused to reload .*HTTP 400.*config"):
            client.ensure_served(not_a_checkpoint)
        assert _protocol(reloader)[-1] == "resume"
        assert reloader.models.default().weights_sha256 == safetensors_digest(tiny_model_dir)
        client.close()


def test_a_server_without_dev_mode_refuses(tiny_model_dir: Path, trained: Path) -> None:
    app = create_app(tiny_model_dir, served_model_name=SERVED, device="cpu")
    with serving_app(app) as url:
        client = _client(_worker(url), trained)
        with pytest.raises(ServedWeightsMismatch, match="HTTP 404"):
            client.ensure_served(trained)
        client.close()


def test_a_request_sent_while_paused_waits_and_is_answered_by_the_new_weights(
    tiny_model_dir: Path, trained: Path
) -> None:
    checkpoint = safetensors_digest(trained)
    with dev_server(tiny_model_dir) as (url, reloader):
        control = DevModeControl(url, timeout=60)
        control.pause()
        prompt = list(TorchPolicyClient(trained, device="cpu").tokenizer().encode(
            "Map: S F F G", add_special_tokens=False))
        answers: list[list[int]] = []

        def request() -> None:
            body = {"model": SERVED, "prompt": prompt, "max_tokens": 8, "temperature": 1.0,
                    "seed": 3, "logprobs": 0, "return_token_ids": True}
            answer = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
            answers.append(answer["choices"][0]["token_ids"])

        waiting = threading.Thread(target=request)
        waiting.start()
        control.collective_rpc("update_config", {"model_config": {"model": str(trained)}})
        control.collective_rpc("reload_weights")
        waiting.join(timeout=0.5)
        assert answers == []  # held while paused
        control.resume()
        waiting.join(timeout=60)
        assert answers == [_local(trained, prompt, seed=3)]
        assert [e for e in reloader.events if e[0] in ("reload_weights", "completion")] == [
            ("reload_weights", checkpoint), ("completion", checkpoint)]
        # The server refuses a reload under live traffic and modes that would mix weights.
        refused = httpx.post(f"{url}/collective_rpc", json={"method": "reload_weights"},
                             timeout=10)
        assert refused.status_code == 400 and "paused" in refused.json()["error"]["message"]
        assert httpx.post(f"{url}/pause", params={"mode": "keep"}, timeout=10).status_code == 400
        control.close()


def test_two_workers_wanting_different_checkpoints_never_keep_a_stale_answer(
    tiny_model_dir: Path, trained: Path, other: Path
) -> None:
    """Worker A holds X; worker B reloads the server to Y; A's next request is answered by
    Y, which A sees on /weight_info afterwards: it discards the answer, reloads X and asks
    again, so what it keeps is X's sample."""
    with dev_server(tiny_model_dir) as (url, reloader):
        worker_a, worker_b = _worker(url), _worker(url)
        on_x, on_y = _client(worker_a, trained), _client(worker_b, other)
        prompt = _prompt(on_x)
        x_sample, y_sample = _local(trained, prompt, seed=7), _local(other, prompt, seed=7)
        assert x_sample != y_sample  # the two checkpoints answer differently

        on_x.ensure_served(trained)
        on_y.ensure_served(other)  # B moves the server under A
        assert _remote(on_x, prompt, seed=7) == x_sample
        answered = [digest for name, digest in reloader.events if name == "completion"]
        # A's first answer came from Y's weights and was discarded; the kept one from X's.
        assert answered == [safetensors_digest(other), safetensors_digest(trained)]
        assert (worker_a.reloads, worker_b.reloads) == (2, 1)
        assert _remote(on_y, prompt, seed=7) == y_sample  # B reloads Y in turn, then keeps it
        assert worker_b.reloads == 2


def test_one_worker_serves_two_checkpoints_in_turn_on_one_server(
    tiny_model_dir: Path, trained: Path, other: Path
) -> None:
    """Inside a worker the lease drains one checkpoint's requests before reloading another:
    concurrent episodes of two checkpoints each get their own checkpoint's samples."""
    with dev_server(tiny_model_dir) as (url, _):
        worker = _worker(url)
        clients = {_client(worker, trained): trained, _client(worker, other): other}
        prompt = _prompt(next(iter(clients)))
        expected = {(i, model_dir): _local(model_dir, prompt, seed=i)
                    for i in range(3) for model_dir in clients.values()}
        got: dict[tuple[int, Path], list[int]] = {}

        def episode(client: OpenAICompatiblePolicyClient, model_dir: Path, seed: int) -> None:
            got[(seed, model_dir)] = _remote(client, prompt, seed)

        threads = [threading.Thread(target=episode, args=(c, d, i))
                   for i in range(3) for c, d in clients.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert got == expected


def test_contention_that_never_settles_fails_the_request_as_infrastructure(
    tiny_model_dir: Path, trained: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with dev_server(tiny_model_dir) as (url, _):
        worker = _worker(url)
        client = _client(worker, trained)
        client.ensure_served(trained)
        # Another worker moves the server after every request this one sends.
        monkeypatch.setattr(worker, "still_holds", lambda *args: False)
        with pytest.raises(InferenceServerError, match="moved to another checkpoint"):
            _remote(client, _prompt(client), seed=1)
        client.close()


def test_a_refusal_found_while_serving_goes_to_the_audit_hook(
    tiny_model_dir: Path, trained: Path, other: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A's server is moved by B; A's reload back is then mislabelled by the server. The
    refusal happens inside generate (PolicyCache does not see it), so the client audits it."""
    with dev_server(tiny_model_dir) as (url, reloader):
        worker_a = _worker(url)
        audited: list[WeightsIntegrityError] = []
        on_x = OpenAICompatiblePolicyClient(
            url, worker_a.served_model(), trained, checkpoint_id=safetensors_digest(trained),
            timeout=60, full_weights=worker_a, audit=audited.append)
        on_x.ensure_served(trained)
        _client(_worker(url), other).ensure_served(other)
        monkeypatch.setattr(reloader, "set_version", lambda version: None)
        with pytest.raises(ServedWeightsMismatch, match="reports weight version") as refused:
            _remote(on_x, _prompt(on_x), seed=1)
        assert audited == [refused.value]
        on_x.close()
