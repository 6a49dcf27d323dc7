"""A served contract's service is contacted at ``env validate`` and ``env register``.

The reference service runs as its own process; ``GET /info`` is asked for real. A wrong
URL, a service nobody runs and a verifier digest other than the pinned one are refused,
each naming the URL, and registration writes nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from typer.testing import CliRunner

from execution_loop.cli import env_app
from governance_loop.environments import (
    ServiceRegistrationError,
    document_from_file,
    register_environment_version,
)
from tests.environment_services import SERVER, free_port, reference_service, write_contract
from tests.factories import uid
from triloop.config import ServiceName, Settings
from triloop.wiring import build_authorizer

pytestmark = pytest.mark.integration
DIGEST = hashlib.sha256(SERVER.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def service_url() -> Iterator[str]:
    with reference_service() as url:
        yield url


def _validate(path: Path, *extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(env_app, ["validate", str(path), *extra])
    return result.exit_code, result.output


def test_validate_asks_the_service_and_accepts_the_pinned_one(
    service_url: str, tmp_path: Path
) -> None:
    code, output = _validate(write_contract(tmp_path, service_url))
    assert code == 0, output
    assert len(output.strip()) == 64  # the contract's id


def test_validate_names_a_digest_mismatch_a_wrong_url_and_a_service_that_is_down(
    service_url: str, tmp_path: Path
) -> None:
    code, output = _validate(write_contract(tmp_path, service_url, digest="0" * 64))
    assert code == 1
    assert "service.verifier_digest" in output and f"declares verifier {DIGEST}" in output
    assert "the contract pins " + "0" * 64 in output and service_url in output

    code, output = _validate(write_contract(tmp_path, f"{service_url}/not-here"))
    assert code == 1 and f"{service_url}/not-here/info answered 404" in output

    down = f"http://127.0.0.1:{free_port()}"
    code, output = _validate(write_contract(tmp_path, down))
    assert code == 1 and f"environment service {down}/info is unreachable" in output

    wider = write_contract(tmp_path, service_url, replace=("[answer]", "[answer, edit_source]"))
    code, output = _validate(wider)
    assert code == 1 and "edit_source" in output and "declares it in GET /info" in output

    # --offline checks the file alone, as before.
    code, output = _validate(write_contract(tmp_path, down), "--offline")
    assert code == 0, output


def _versions(engine: Engine, name: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT count(*) FROM environment_version WHERE environment_name = :n"),
            {"n": name}).scalar_one())


def test_register_refuses_a_service_that_is_not_the_pinned_one_and_writes_nothing(
    service_url: str, tmp_path: Path, settings: Settings, owner_engine: Engine,
    role_engine: Callable[[ServiceName], Engine],
) -> None:
    governance = role_engine("governance")
    authorizer = build_authorizer(settings, "governance")
    name = uid("served-")
    cases = [
        ((service_url, "0" * 64), f"declares verifier {DIGEST}, the contract pins " + "0" * 64),
        ((f"http://127.0.0.1:{free_port()}", None), "is unreachable"),
        ((f"{service_url}/wrong", None), "/wrong/info answered 404"),
    ]
    for (url, digest), expected in cases:
        document = document_from_file(write_contract(tmp_path, url, digest=digest), name=name)
        with pytest.raises(ServiceRegistrationError, match=expected):
            register_environment_version(engine=governance, authorizer=authorizer,
                                         document=document, requested_by="gov-admin")
    assert _versions(owner_engine, name) == 0
    good = document_from_file(write_contract(tmp_path, service_url), name=name)
    stored = register_environment_version(engine=governance, authorizer=authorizer,
                                          document=good, requested_by="gov-admin")
    assert stored.created and _versions(owner_engine, name) == 1
