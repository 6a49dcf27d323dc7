"""Checkpoints: content ids, layout, round-trip to bit-identical weights and next update."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, Qwen2Config

from learning_loop.batch import TrainingSample
from learning_loop.checkpoints import (
    TRAINER_STATE,
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
    saved_weights_digest,
    weights_digest,
)
from learning_loop.update import UpdateSettings, build_optimizer, update_policy
from triloop.run_config import OptimizerConfig


def tiny_model(seed: int = 0, *, tied: bool = False) -> PreTrainedModel:
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied,
    )
    model: PreTrainedModel = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    return model


SAMPLES = [
    TrainingSample("a", "g", "t", 0, (1, 2, 3), (4, 5), (-4.0, -4.2), 1.0),
    TrainingSample("b", "g", "t", 0, (1, 2, 3), (6,), (-4.1,), -1.0),
    TrainingSample("c", "h", "t", 0, (9, 8), (7, 7, 7), (-4.0, -4.0, -4.0), 0.5),
]


def state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def bit_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_digest_depends_on_contents_only() -> None:
    a = {"x": torch.arange(6, dtype=torch.float32), "y": torch.ones(2, 2)}
    reordered = {"y": torch.ones(2, 2), "x": torch.arange(6, dtype=torch.float32)}
    assert weights_digest(a) == weights_digest(reordered)
    flipped = {**a, "x": a["x"].clone()}
    flipped["x"][5] = torch.nextafter(flipped["x"][5], torch.tensor(10.0))  # one ulp
    assert weights_digest(flipped) != weights_digest(a)
    assert weights_digest({**a, "x": a["x"].reshape(2, 3)}) != weights_digest(a)
    assert weights_digest({**a, "x": a["x"].view(torch.int32)}) != weights_digest(a)
    assert weights_digest({"z": a["x"], "y": a["y"]}) != weights_digest(a)
    assert weights_digest({"bf": torch.ones(3, dtype=torch.bfloat16)})  # no numpy dtype needed


def test_layout_and_same_weights_same_id(tmp_path: Path) -> None:
    model = tiny_model()
    first = save_checkpoint(tmp_path, model, data_cursor={"iteration": 1})
    assert first.path == tmp_path / "checkpoints" / first.id
    names = {p.name for p in first.path.iterdir()}
    assert {"config.json", "model.safetensors", TRAINER_STATE} <= names
    assert saved_weights_digest(first.path) == first.id
    assert len(first.id) == 64
    # Same weights again (a fresh model object, a different cursor): same id, newer state.
    second = save_checkpoint(tmp_path, tiny_model(), data_cursor={"iteration": 2})
    assert second == first
    loaded = load_checkpoint(second.path, tiny_model(seed=5))
    assert loaded.data_cursor == {"iteration": 2}
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == [first.id]  # no staging left
    assert save_checkpoint(tmp_path, tiny_model(seed=1)).id != first.id


class FakeTokenizer:
    """Stands in for a tokenizer: only its save_pretrained matters here."""

    def __init__(self, vocab: str) -> None:
        self.vocab = vocab

    def save_pretrained(self, save_directory: str | os.PathLike[str]) -> None:
        (Path(save_directory) / "tokenizer.json").write_text(self.vocab)


def test_tokenizer_files_travel_but_do_not_change_the_id(tmp_path: Path) -> None:
    plain = save_checkpoint(tmp_path / "a", tiny_model())
    with_tokenizer = save_checkpoint(tmp_path / "b", tiny_model(), tokenizer=FakeTokenizer("v1"))
    assert with_tokenizer.id == plain.id
    assert (with_tokenizer.path / "tokenizer.json").read_text() == "v1"


def test_saved_model_loads_with_from_pretrained(tmp_path: Path) -> None:
    model = tiny_model(tied=True)
    ref = save_checkpoint(tmp_path, model)
    reloaded = AutoModelForCausalLM.from_pretrained(ref.path)
    assert bit_identical(state(model), state(reloaded))
    # Tied weights load into an existing model too.
    other = tiny_model(seed=3, tied=True)
    load_checkpoint(ref.path, other)
    assert bit_identical(state(model), state(other))


def test_round_trip_resumes_to_an_identical_next_update(tmp_path: Path) -> None:
    settings = UpdateSettings()
    config = OptimizerConfig(learning_rate=1e-2, warmup_steps=3)
    model = tiny_model()
    optimizer, scheduler = build_optimizer(model, config)
    update_policy(model, optimizer, SAMPLES, settings, policy_version=0, scheduler=scheduler)
    random.seed(11)
    ref = save_checkpoint(tmp_path, model, optimizer, scheduler,
                          data_cursor={"iteration": 1, "batch": "b-1"},
                          metadata={"run_id": "r1", "parent": None})
    saved, saved_lr = state(model), scheduler.get_last_lr()
    expected_draws = (random.random(), torch.rand(3))
    update_policy(model, optimizer, SAMPLES, settings, policy_version=1, scheduler=scheduler)
    continued = state(model)

    resumed = tiny_model(seed=7)
    optimizer2, scheduler2 = build_optimizer(resumed, config)
    loaded = load_checkpoint(ref.path, resumed, optimizer2, scheduler2)
    assert bit_identical(state(resumed), saved)
    assert loaded.ref == ref
    assert loaded.data_cursor == {"iteration": 1, "batch": "b-1"}
    assert loaded.metadata == {"run_id": "r1", "parent": None}
    draws = (random.random(), torch.rand(3))
    assert draws[0] == expected_draws[0] and torch.equal(draws[1], expected_draws[1])
    assert scheduler2.get_last_lr() == saved_lr
    update_policy(resumed, optimizer2, SAMPLES, settings, policy_version=1, scheduler=scheduler2)
    assert bit_identical(state(resumed), continued)
    assert scheduler2.get_last_lr() == scheduler.get_last_lr()


def test_tampered_weights_are_refused(tmp_path: Path) -> None:
    ref = save_checkpoint(tmp_path, tiny_model())
    other = save_checkpoint(tmp_path, tiny_model(seed=1))
    (ref.path / "model.safetensors").write_bytes((other.path / "model.safetensors").read_bytes())
    with pytest.raises(CheckpointError, match="hash to"):
        load_checkpoint(ref.path, tiny_model())


def test_missing_pieces_are_refused(tmp_path: Path) -> None:
    model = tiny_model()
    with pytest.raises(CheckpointError, match="no checkpoint directory"):
        load_checkpoint(tmp_path / "nope", model)
    ref = save_checkpoint(tmp_path, model)  # saved without optimizer state
    optimizer, _ = build_optimizer(model, OptimizerConfig())
    with pytest.raises(CheckpointError, match="without optimizer state"):
        load_checkpoint(ref.path, model, optimizer)
    (ref.path / TRAINER_STATE).unlink()
    with pytest.raises(CheckpointError, match="cannot be resumed"):
        load_checkpoint(ref.path, model)


def test_architecture_mismatch_is_refused(tmp_path: Path) -> None:
    ref = save_checkpoint(tmp_path, tiny_model())
    torch.manual_seed(0)
    bigger = AutoModelForCausalLM.from_config(Qwen2Config(  # type: ignore[no-untyped-call]
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2))
    with pytest.raises(CheckpointError, match="lacks weights"):
        load_checkpoint(ref.path, bigger)
