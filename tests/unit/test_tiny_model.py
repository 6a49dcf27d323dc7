"""The tiny model: created locally, loadable with the Auto classes, deterministic per seed."""

from __future__ import annotations

import hashlib
import os
import string
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from learning_loop.cli import model_app
from learning_loop.tiny_model import (
    ENVIRONMENT_WORDS,
    ROLE_TOKENS,
    build_tokenizer,
    create_tiny_model,
    tiny_model_info,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)

STANDARD_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def _digests(path: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.iterdir())}


def test_round_trips_through_the_auto_classes(model_dir: Path) -> None:
    assert STANDARD_FILES <= {f.name for f in model_dir.iterdir()}
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.vocab_size == len(tokenizer)
    info = tiny_model_info(model_dir)
    assert 100_000 <= info.num_parameters <= 2_000_000
    assert info.num_parameters == sum(p.numel() for p in model.parameters())
    # AutoTokenizer must load our tokenizer.json as written, not rebuild another tokenizer.
    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    text = "You reached the goal! Action: L\n  x = 3 + 41"
    assert tokenizer(text, add_special_tokens=False).input_ids == raw.encode(text).ids
    ids = tokenizer("Move left", return_tensors="pt").input_ids
    assert model(input_ids=ids).logits.shape == (1, ids.shape[1], len(tokenizer))


def test_same_seed_gives_identical_files_and_another_seed_other_weights(
    model_dir: Path, tmp_path: Path
) -> None:
    again = create_tiny_model(tmp_path / "again", seed=0)
    other = create_tiny_model(tmp_path / "other", seed=1)
    assert _digests(again) == _digests(model_dir)
    assert _digests(other)["model.safetensors"] != _digests(model_dir)["model.safetensors"]
    assert _digests(other)["tokenizer.json"] == _digests(model_dir)["tokenizer.json"]


def test_creating_a_model_leaves_the_callers_random_state_alone(tmp_path: Path) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    create_tiny_model(tmp_path / "m", seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_chat_template_renders_roles_and_generation_prompt(model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    messages = [
        {"role": "system", "content": "Play."},
        {"role": "user", "content": "Map: S F"},
        {"role": "assistant", "content": "L"},
        {"role": "tool", "content": "42"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|bos|><|system|>\nPlay.<|end|>\n<|user|>\nMap: S F<|end|>\n"
        "<|assistant|>\nL<|end|>\n<|tool|>\n42<|end|>\n<|assistant|>\n"
    )
    ids = tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    assert ids[0] == tokenizer.bos_token_id
    assert ids[-2] == tokenizer.convert_tokens_to_ids("<|assistant|>")
    with pytest.raises(Exception, match="unknown chat role"):
        tokenizer.apply_chat_template([{"role": "robot", "content": "x"}], tokenize=False)


def test_tokenizer_covers_ascii_and_makes_actions_digits_and_words_single_tokens() -> None:
    tokenizer = build_tokenizer()
    text = string.printable.replace("\x0b", "").replace("\x0c", "").replace("\r", "")
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False).input_ids) == text
    for single in ["L", "R", "U", "D", *string.digits, "goal", " goal", "Hole", " tests"]:
        assert len(tokenizer(single, add_special_tokens=False).input_ids) == 1, single
    assert {"goal", "hole", "python", "tests"} <= set(ENVIRONMENT_WORDS)
    special = set(tokenizer.all_special_tokens)
    assert set(ROLE_TOKENS) <= special
    assert {tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token} <= special
    assert tokenizer.eos_token == "<|end|>"


def test_pure_character_vocabulary_when_no_words_are_given() -> None:
    tokenizer = build_tokenizer(())
    assert len(tokenizer) < 120
    assert len(tokenizer("goal", add_special_tokens=False).input_ids) == 4


def test_cli_init_tiny_reports_what_it_made(tmp_path: Path) -> None:
    target = tmp_path / "cli-model"
    result = CliRunner().invoke(model_app, ["init-tiny", str(target), "--seed", "3"])
    assert result.exit_code == 0, result.output
    info = tiny_model_info(target)
    assert f"{info.num_parameters:,} parameters" in result.output
    assert f"vocabulary of {info.vocab_size} tokens" in result.output


def test_cli_init_tiny_refuses_a_non_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    result = CliRunner().invoke(model_app, ["init-tiny", str(tmp_path)])
    assert result.exit_code == 1
    assert "not empty" in result.output
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_a_created_model_is_readable_by_every_loops_os_user(tmp_path: Path) -> None:
    """The weights' writer makes its file 0600; the loops read the base as other OS users."""
    path = create_tiny_model(tmp_path / "m", seed=0)
    assert (path.stat().st_mode & 0o777) == 0o755
    for file in path.iterdir():
        assert (file.stat().st_mode & 0o777) == 0o644, file.name
