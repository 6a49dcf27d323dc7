"""A contract sent as text, with its fixtures as content, laid out as files to check and hash.

``triloop governance env register`` sends the contract's YAML and every fixture file it
lists (base64, keyed by the path relative to the contract). The web service checks the
upload before it records the person's decision, so a bad contract leaves nothing behind;
governance lays the same upload out again from the decision row and registers it exactly
as a contract file on disk, with the same checks (``triloop env validate`` without the
execution loop's capability table, which only that loop holds).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from tempfile import TemporaryDirectory

from triloop.contract_checks import ContractProblem
from triloop.contracts import validate_contract_text

CONTRACT_FILE = "contract.yaml"
# What one upload may carry in fixture bytes (decoded); the decision row stores it all. Through
# the API the request body's own bound (TRILOOP_MAX_BODY_BYTES, 1 MiB by default) comes first.
MAX_FIXTURE_BYTES = 2_000_000


def _relative(path: str) -> PurePosixPath | None:
    pure = PurePosixPath(path)
    if (not path or pure.is_absolute() or ".." in pure.parts or not pure.parts
            or pure.as_posix() == CONTRACT_FILE or not path.isprintable()
            or any(len(part.encode()) > 255 for part in pure.parts)):
        return None
    return pure


def decode_fixtures(fixtures: Mapping[str, str]) -> tuple[dict[str, bytes], list[ContractProblem]]:
    """The fixture files' bytes, and a problem for each bad path or base64 text."""
    files: dict[str, bytes] = {}
    problems: list[ContractProblem] = []
    for name, text in sorted(fixtures.items()):
        relative = _relative(name)
        if relative is None:
            problems.append(ContractProblem(f"fixtures[{name!r}]",
                                            "a fixture path must stay inside the contract's"
                                            f" folder and may not be {CONTRACT_FILE}"))
            continue
        try:
            files[relative.as_posix()] = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            problems.append(ContractProblem(f"fixtures[{name!r}]", "is not base64"))
    total = sum(len(b) for b in files.values())
    if total > MAX_FIXTURE_BYTES:
        problems.append(ContractProblem("fixtures", f"{total} bytes of fixtures; at most"
                                                    f" {MAX_FIXTURE_BYTES} may be uploaded"))
    return files, problems


def encode_fixture(data: bytes) -> str:
    """A fixture file's bytes as the upload carries them."""
    return base64.b64encode(data).decode("ascii")


@contextmanager
def laid_out(contract_yaml: str, fixtures: Mapping[str, bytes]) -> Iterator[Path]:
    """The contract file in a fresh folder with its fixtures beside it (removed after)."""
    with TemporaryDirectory(prefix="triloop-contract-") as folder:
        root = Path(folder)
        for name, data in fixtures.items():
            target = root / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        contract = root / CONTRACT_FILE
        contract.write_text(contract_yaml, encoding="utf-8")
        yield contract


def upload_problems(contract_yaml: str, fixtures: Mapping[str, str]) -> list[ContractProblem]:
    """Every problem in an uploaded contract and its fixtures (empty when it may register)."""
    files, problems = decode_fixtures(fixtures)
    if problems:
        return problems
    try:
        with laid_out(contract_yaml, files) as contract:
            return validate_contract_text(contract_yaml, base_dir=contract.parent)
    except (OSError, ValueError) as error:  # e.g. "a" and "a/b" both sent as files
        return [ContractProblem("fixtures", f"the fixtures cannot be laid out as files: {error}")]


def pack_contract_file(path: Path) -> tuple[str, dict[str, str], str | None]:
    """A contract file as the API takes it: its text, the fixtures it lists, and its task.

    Only what the document names is read: each listed fixture file, or every file under a
    listed folder (caches left out, as ``fixture_hashes`` leaves them out). A fixture that is
    missing is left out too; the server then names it among the contract's problems.
    """
    from triloop.contract_checks import yaml_problems
    from triloop.contracts import IGNORED_FIXTURE_PARTS

    text = path.read_text(encoding="utf-8")
    _, data, _ = yaml_problems(text)
    listed = (data or {}).get("fixtures")
    task = (data or {}).get("task")
    fixtures: dict[str, str] = {}
    for entry in listed if isinstance(listed, list) else []:
        relative = _relative(entry) if isinstance(entry, str) else None
        if relative is None:
            continue
        root = path.parent / relative
        if root.is_file():
            fixtures[relative.as_posix()] = encode_fixture(root.read_bytes())
        elif root.is_dir():
            for file in sorted(p for p in root.rglob("*") if p.is_file()):
                inner = file.relative_to(root).parts
                if IGNORED_FIXTURE_PARTS.intersection(inner) or file.suffix == ".pyc":
                    continue
                key = PurePosixPath(relative, *inner).as_posix()
                fixtures[key] = encode_fixture(file.read_bytes())
    return text, fixtures, task if isinstance(task, str) else None
