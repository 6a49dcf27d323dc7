"""LoRA adapter checkpoints served from the store: the torch backend puts the adapter on its
base (verified, shared), and the OpenAI-compatible backend loads it through the runtime
LoRA route on a server that serves the base. Both reproduce the learner's logprobs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from sqlalchemy import Engine, text

from execution_loop.inference.base import PolicyClient
from execution_loop.serving import PolicyCache, WeightsIntegrityError, backend_factory
from learning_loop.batch import TrainingSample
from learning_loop.checkpoints import CheckpointRef, save_checkpoint
from learning_loop.iteration import load_model
from learning_loop.lora import AdapterModel, adapter_record, wrap_lora
from learning_loop.objective import policy_action_logprobs
from tests.factories_execution import _insert_once, content_addressed, register_checkpoint_dir
from tests.model_servers import serving
from triloop.config import Settings
from triloop.run_config import LoraConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CPU = torch.device("cpu")
LORA = LoraConfig(rank=4, alpha=8, target_modules=["q_proj", "v_proj", "o_proj"])
PROMPT = [1, 40, 50, 60]


def trained_adapter(base: CheckpointRef, into: Path) -> tuple[Any, CheckpointRef]:
    """An adapter on ``base`` with non-zero B (what a few updates would leave), saved."""
    learner = wrap_lora(load_model(base.path, CPU), LORA, base_id=base.id, seed=7)
    with torch.no_grad():
        for name, param in learner.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn_like(param) * 0.3)
    return learner, save_checkpoint(into, AdapterModel(learner, base.path))


def register_adapter(engine: Engine, ref: CheckpointRef, base_id: str, *,
                     base_model: str | None = None) -> None:
    _insert_once(engine, "checkpoint", "id", id=ref.id, parent_id=base_id,
                 base_model=base_model or base_id, artifact_uri=ref.path.resolve().as_uri(),
                 created_by="learning", data=adapter_record(ref.path))


def learner_logprobs(learner: Any, tokens: list[int]) -> list[float]:
    one = TrainingSample("", "", "", 0, tuple(PROMPT), tuple(tokens), (0.0,) * len(tokens), 0.0)
    return policy_action_logprobs(learner, [one], device=CPU)[0]


@pytest.fixture
def adapter(owner_engine: Engine, tiny_model_dir: Path, tmp_path: Path
            ) -> tuple[Any, CheckpointRef, CheckpointRef]:
    base_id = register_checkpoint_dir(owner_engine, tiny_model_dir)
    base = CheckpointRef(base_id, content_addressed(tiny_model_dir, base_id))
    learner, ref = trained_adapter(base, tmp_path / "artifacts")
    register_adapter(owner_engine, ref, base_id)
    return learner, ref, base


def test_the_torch_backend_serves_an_adapter_on_its_base_with_the_learners_logprobs(
    owner_engine: Engine, settings: Settings, tmp_path: Path,
    adapter: tuple[Any, CheckpointRef, CheckpointRef],
) -> None:
    learner, ref, _ = adapter
    with owner_engine.connect() as conn:
        row = conn.execute(text("SELECT base_model, data FROM checkpoint WHERE id = :i"),
                           {"i": ref.id}).one()
    assert row.data["adapter"]["base_checkpoint_id"] == row.base_model
    cache = PolicyCache(engine=owner_engine, factory=backend_factory(settings), home=tmp_path)
    client: PolicyClient = cache.get(ref.id)
    try:
        sampled = client.sample(PROMPT, max_new_tokens=6, temperature=1.0, seed=3,  # type: ignore[attr-defined]
                                ignore_eos=True)
        assert learner_logprobs(learner, list(sampled.token_ids)) == pytest.approx(
            sampled.logprobs, abs=1e-4)
    finally:
        client.close()  # type: ignore[attr-defined]


def test_an_adapter_whose_row_names_another_base_is_refused_and_audited(
    owner_engine: Engine, settings: Settings, tiny_model_dir: Path, tmp_path: Path,
) -> None:
    base_id = register_checkpoint_dir(owner_engine, tiny_model_dir)
    base = CheckpointRef(base_id, content_addressed(tiny_model_dir, base_id))
    learner, ref = trained_adapter(base, tmp_path / "artifacts")
    with torch.no_grad():  # another adapter than the fixture's, so another id
        next(p for n, p in learner.named_parameters() if "lora_A" in n).add_(1.0)
    ref = save_checkpoint(tmp_path / "artifacts", AdapterModel(learner, base.path))
    register_adapter(owner_engine, ref, base_id, base_model="f" * 64)
    cache = PolicyCache(engine=owner_engine, factory=backend_factory(settings), home=tmp_path)
    with pytest.raises(WeightsIntegrityError, match="its row names base f{64}"):
        cache.get(ref.id)
    with owner_engine.connect() as conn:
        events = conn.execute(text(
            "SELECT count(*) FROM audit_event WHERE action = 'integrity_violation'"
            " AND resource->>'id' = :c"), {"c": ref.id}).scalar_one()
    assert events == 1


def test_the_openai_backend_loads_an_adapter_through_the_runtime_lora_route(
    owner_engine: Engine, settings: Settings, tmp_path: Path,
    adapter: tuple[Any, CheckpointRef, CheckpointRef],
) -> None:
    learner, ref, base = adapter
    with serving(base.path, "base", runtime_loading=True, dev_mode=True) as url:
        # Full-weight reloading is configured, yet the adapter goes through the LoRA route.
        own = settings.model_copy(update={"inference_backend": "openai", "inference_url": url,
                                          "inference_reload": "full"})
        cache = PolicyCache(engine=owner_engine, factory=backend_factory(own), home=tmp_path)
        client = cache.get(ref.id)
        try:
            generation = client.generate(PROMPT, max_new_tokens=5, temperature=1.0, seed=5)
        finally:
            client.close()  # type: ignore[attr-defined]
        cards = {c["id"]: c for c in httpx.get(f"{url}/v1/models", timeout=10).json()["data"]}
    assert cards[ref.id]["weights_sha256"] == ref.id
    assert cards[ref.id]["parent"] == "base"
    assert learner_logprobs(learner, list(generation.token_ids)) == pytest.approx(
        generation.logprobs, abs=1e-4)


def test_the_model_server_refuses_an_adapter_on_another_base(
    tiny_model_dir: Path, tmp_path: Path, adapter: tuple[Any, CheckpointRef, CheckpointRef],
) -> None:
    from learning_loop.tiny_model import create_tiny_model

    _, ref, _ = adapter
    other = create_tiny_model(tmp_path / "other", seed=1)
    with serving(other, "other", runtime_loading=True) as url:
        answer = httpx.post(f"{url}/v1/load_lora_adapter", timeout=60,
                            json={"lora_name": ref.id, "lora_path": str(ref.path)})
    assert answer.status_code == 400
    assert "is a LoRA adapter on base" in answer.text
