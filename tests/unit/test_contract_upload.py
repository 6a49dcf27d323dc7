"""A contract upload is checked as the file on disk would be, and refused path by path."""

from __future__ import annotations

from pathlib import Path

from triloop.contract_upload import pack_contract_file, upload_problems

LAKE = Path(__file__).parents[2] / "execution_loop/environments/contracts/frozen_lake.yaml"


def test_a_packed_contract_file_is_valid_as_uploaded(tmp_path: Path) -> None:
    (tmp_path / "maps" / "__pycache__").mkdir(parents=True)
    (tmp_path / "maps" / "a.txt").write_text("PFFF\n")
    (tmp_path / "maps" / "__pycache__" / "x.pyc").write_bytes(b"cache")
    (tmp_path / "notes.txt").write_text("hi")
    contract = tmp_path / "c.yaml"
    contract.write_text(LAKE.read_text() + "fixtures:\n  - maps\n  - notes.txt\n")
    text, fixtures, task = pack_contract_file(contract)
    assert task == "frozen_lake" and set(fixtures) == {"maps/a.txt", "notes.txt"}
    assert upload_problems(text, fixtures) == []
    missing = upload_problems(text, {"maps/a.txt": fixtures["maps/a.txt"]})
    assert any("notes.txt" in str(p) for p in missing)


def test_bad_fixture_paths_and_content_are_each_named() -> None:
    text = LAKE.read_text()
    for fixtures, needle in (
        ({"../etc/passwd": "eA=="}, "inside the contract's folder"),
        ({"/abs": "eA=="}, "inside the contract's folder"),
        ({"contract.yaml": "eA=="}, "contract.yaml"),
        ({"a\x00b": "eA=="}, "inside the contract's folder"),
        ({"x" * 300: "eA=="}, "inside the contract's folder"),
        ({"ok": "not base64!"}, "is not base64"),
        ({"a": "eA==", "a/b": "eA=="}, "cannot be laid out"),
    ):
        problems = upload_problems(text, fixtures)
        assert problems and needle in str(problems[0]), (fixtures, problems)


def test_every_contract_problem_is_named_with_its_line() -> None:
    bad = LAKE.read_text().replace("max_turns: 10", "max_turns: -3") + "colour: blue\n"
    problems = upload_problems(bad, {})
    assert len(problems) == 2 and all(p.line for p in problems)


def test_a_built_in_contract_with_a_fixture_folder_packs_whole() -> None:
    ci = LAKE.parent / "fix_ci_failure.yaml"
    text, fixtures, task = pack_contract_file(ci)
    assert task == "fix_ci_failure" and fixtures
    assert all(name.startswith("fixtures/ci_repos/") for name in fixtures)
    assert upload_problems(text, fixtures) == []


def test_an_upload_has_the_same_fixture_hashes_as_the_file_on_disk() -> None:
    from triloop.contract_upload import decode_fixtures, laid_out
    from triloop.contracts import fixture_hashes, load_contract

    ci = LAKE.parent / "fix_ci_failure.yaml"
    text, fixtures, _ = pack_contract_file(ci)
    files, _ = decode_fixtures(fixtures)
    with laid_out(text, files) as uploaded:
        assert fixture_hashes(load_contract(uploaded)) == fixture_hashes(load_contract(ci))
