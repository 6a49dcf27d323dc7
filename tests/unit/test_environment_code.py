"""Versions that cover code: the environment's and verifier's sources are in the id, the
diff shows them, registration pins the verifier hash; checkpoints hash what serves them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from execution_loop.environments.registry import builtin_contract_path
from governance_loop.environments import comparable, document_from_file
from learning_loop.checkpoints import serving_hashes
from triloop.contract_diff import diff_contracts
from triloop.contracts import contract_id, load_contract
from triloop.environment_code import (
    EnvironmentCodeError,
    environment_code_hashes,
    environment_verifier_hash,
)

ROOT = Path(__file__).resolve().parents[2]


def copy_of_the_code(tmp_path: Path) -> Path:
    """The execution loop's package, copied, so a test may edit reward logic."""
    shutil.copytree(ROOT / "execution_loop", tmp_path / "execution_loop",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_the_code_of_fix_ci_failure_and_its_verifier_is_covered() -> None:
    code = environment_code_hashes("fix_ci_failure")
    for module in ("fix_ci_failure", "ci_verifier", "ci_suite", "ci_repo", "ci_actions"):
        assert f"execution_loop.environments.{module}" in code
    assert "execution_loop.environments/ci_guard.py" in code  # read as text, not imported
    assert "triloop.contracts" not in code  # imported for type checking only
    with pytest.raises(EnvironmentCodeError):
        environment_code_hashes("no_such_environment")


def test_changing_reward_logic_makes_a_new_version_and_the_diff_shows_it(tmp_path: Path) -> None:
    search = [str(copy_of_the_code(tmp_path))]
    contract = load_contract(builtin_contract_path("fix_ci_failure"))
    before = environment_code_hashes("fix_ci_failure", search)
    assert before == environment_code_hashes("fix_ci_failure")  # same bytes, same hashes
    verifier = tmp_path / "execution_loop" / "environments" / "ci_verifier.py"
    verifier.write_text(verifier.read_text().replace(
        'reward = terms["success"] if success', 'reward = terms["success"] if True'))
    after = environment_code_hashes("fix_ci_failure", search)
    hashes = {"f": "0" * 64}
    assert contract_id(contract, hashes, before) != contract_id(contract, hashes, after)
    assert environment_verifier_hash("fix_ci_failure", search) != environment_verifier_hash(
        "fix_ci_failure")
    changes = diff_contracts(comparable({}, {}, before), comparable({}, {}, after))
    assert [c.path for c in changes] == ['code_hashes["execution_loop.environments.ci_verifier"]']


def test_registration_documents_carry_code_and_the_pinned_verifier_hash() -> None:
    document = document_from_file(builtin_contract_path("fix_ci_failure"))
    contract = load_contract(builtin_contract_path("fix_ci_failure"))
    assert document.code_hashes == environment_code_hashes("fix_ci_failure")
    assert document.version_id == contract_id(contract)
    assert document.version_id != contract_id(contract, code={})
    assert document.verifier_hash == environment_verifier_hash("fix_ci_failure")
    assert document.verifier_hash is not None and len(document.verifier_hash) == 64


def test_a_contract_for_an_unknown_environment_cannot_be_registered(tmp_path: Path) -> None:
    text = builtin_contract_path("frozen_lake").read_text()
    path = tmp_path / "c.yaml"
    path.write_text(text.replace("task: frozen_lake", "task: not_implemented"))
    with pytest.raises(EnvironmentCodeError, match="not_implemented"):
        document_from_file(path)


def test_serving_hashes_cover_tokenizer_config_and_chat_template(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    assert serving_hashes(model).tokenizer_sha256 is None
    (model / "tokenizer.json").write_text('{"vocab": 1}')
    (model / "config.json").write_text(json.dumps({"hidden": 8, "transformers_version": "4"}))
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ m }}"}))
    first = serving_hashes(model)
    assert None not in (first.tokenizer_sha256, first.model_config_sha256,
                        first.chat_template_sha256)
    (model / "config.json").write_text(json.dumps({"transformers_version": "5", "hidden": 8}))
    assert serving_hashes(model).model_config_sha256 == first.model_config_sha256
    (model / "chat_template.jinja").write_text("{{ other }}")
    second = serving_hashes(model)
    assert second.chat_template_sha256 != first.chat_template_sha256
    (model / "tokenizer.json").write_text('{"vocab": 2}')
    assert serving_hashes(model).tokenizer_sha256 != first.tokenizer_sha256
