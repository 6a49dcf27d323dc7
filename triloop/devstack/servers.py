"""Start commands for the Temporal dev server (quick mode) and the OPA server."""

from __future__ import annotations

import hashlib
import json
import os
import socket
from collections.abc import Sequence
from pathlib import Path

import httpx

from triloop.config import SERVICES
from triloop.devstack.accounts import ServiceAccount
from triloop.devstack.opa_bundles import build_signed, ensure_signing_key
from triloop.devstack.processes import ServiceProcess, start_process, wait_until
from triloop.policy.opa import TOKENS_BUNDLE
from triloop.secrets import ensure_secret, hand_out, opa_token_name


def repo_root() -> Path:
    """The checkout this package runs from."""
    return Path(__file__).resolve().parents[2]


def tool_path(name: str) -> str:
    """A tool provided by the bootstrap under ``.triloop/bin`` (or on PATH)."""
    local = repo_root() / ".triloop" / "bin" / name
    if local.exists():
        return str(local)
    import shutil

    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(
            f"'{name}' not found in {local.parent} or on PATH; run scripts/bootstrap.sh"
        )
    return found


def start_temporal(
    *,
    db_file: Path,
    port: int,
    ui_port: int | None,
    http_port: int,
    metrics_port: int,
    run_dir: Path,
    log_dir: Path,
    name: str = "temporal",
    namespaces: Sequence[str] = (),
) -> ServiceProcess:
    """``temporal server start-dev`` with durable state in ``db_file`` (quick mode).

    The dev server authenticates nobody; ``triloop dev status`` and the console say so.
    """
    argv = [
        tool_path("temporal"),
        "server",
        "start-dev",
        "--db-filename",
        str(db_file),
        "--ip",
        "127.0.0.1",
        "--port",
        str(port),
        "--http-port",
        str(http_port),
        "--metrics-port",
        str(metrics_port),
        "--log-level",
        "warn",
    ]
    argv += ["--headless"] if ui_port is None else ["--ui-port", str(ui_port)]
    for namespace in namespaces:
        argv += ["--namespace", namespace]
    db_file.parent.mkdir(parents=True, exist_ok=True)
    proc = start_process(name, argv, run_dir=run_dir, log_dir=log_dir)
    wait_until(
        lambda: _tcp_open(port),
        name=name,
        log_path=proc.log_path,
        timeout_s=60,
        alive=lambda: _alive(proc),
    )
    return proc


def start_opa(
    *,
    policies: Path,
    port: int,
    run_dir: Path,
    log_dir: Path,
    secrets_dir: Path,
    name: str = "opa",
    account: ServiceAccount | None = None,
    own_secrets: Path | None = None,
) -> ServiceProcess:
    """``opa run --server`` on the policy folder as a bundle, decision logs to its log file.

    No ``--watch``: a policy takes effect when OPA (re)starts (``triloop dev down`` then
    ``up``, or a restart of the OPA service), with the manifest regenerated, so every
    decision reports the revision that decided it; each process's audit sink records a
    ``policy_revision_changed`` event the first time it sees a new revision.

    Console decision logging is what makes OPA issue a ``decision_id`` per query. OPA's
    own token authentication is on: ``policies/system/authz`` lets each service's bearer
    token ask only about that service, with the tokens (as sha256) in a second bundle
    written from ``secrets_dir``. Both bundles are signed with the install's key and OPA
    verifies them (``opa_bundles``): it refuses to start on a bundle signed otherwise.

    With ``account`` OPA runs as that user and reads the verification key from a copy in
    ``own_secrets``, its own folder: the secrets folder (with the signing key) is root's.
    The built bundles hold the policies and token digests only, nothing secret.
    """
    write_bundle_manifest(policies)
    tokens = write_tokens_bundle(secrets_dir)
    signing_key, verification_key = ensure_signing_key(secrets_dir)
    if account is not None:
        folder = own_secrets or secrets_dir.parent / "services" / name / "secrets"
        verification_key = hand_out(secrets_dir, folder, [verification_key.name],
                                    owner=(account.uid, account.gid)) / verification_key.name
    built = secrets_dir.parent / "opa-bundles" / name
    bundles = [build_signed(tool_path("opa"), source, built / f"{source.name}.tar.gz",
                            signing_key) for source in (policies, tokens)]
    argv = [
        tool_path("opa"),
        "run",
        "--server",
        "--addr",
        f"127.0.0.1:{port}",
        "--log-level",
        "error",
        "--set",
        "decision_logs.console=true",
        "--authentication=token",
        "--authorization=basic",
        "--verification-key",
        str(verification_key),
        "--bundle",
        *(str(bundle) for bundle in bundles),
    ]
    proc = start_process(name, argv, run_dir=run_dir, log_dir=log_dir, account=account)
    wait_until(
        lambda: _http_ok(f"http://127.0.0.1:{port}/health"),
        name=name,
        log_path=proc.log_path,
        timeout_s=30,
        alive=lambda: _alive(proc),
    )
    return proc


def policy_revision(policies: Path) -> str:
    """sha256 over the Rego files (path and content): the revision OPA reports."""
    digest = hashlib.sha256()
    for path in sorted(policies.rglob("*.rego")):
        digest.update(str(path.relative_to(policies)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def write_bundle_manifest(policies: Path) -> None:
    """Serve the folder as a bundle whose revision is the policies' content hash.

    OPA only reports a revision (``provenance``) for bundles; every decision's
    audit row then names the exact policy text it came from. The manifest is
    generated at every start, and OPA runs without ``--watch``: an edited policy takes
    effect, with its new revision, when OPA restarts.
    """
    roots = ["triloop", "system/authz", "system/authz_test"]
    manifest = {"revision": policy_revision(policies), "roots": roots}
    (policies / ".manifest").write_text(json.dumps(manifest))


def write_tokens_bundle(secrets_dir: Path) -> Path:
    """The bundle of ``data.system.tokens``: sha256 of each service's token -> the service.

    Only digests go to OPA, so its memory and decision logs never hold a usable token.
    """
    tokens = {hashlib.sha256(ensure_secret(secrets_dir, opa_token_name(s)).encode()).hexdigest(): s
              for s in SERVICES}
    bundle = secrets_dir / TOKENS_BUNDLE
    (bundle / "system" / "tokens").mkdir(parents=True, exist_ok=True)
    os.chmod(bundle, 0o700)
    (bundle / "system" / "tokens" / "data.json").write_text(json.dumps(tokens))
    (bundle / ".manifest").write_text(json.dumps({"revision": "", "roots": ["system/tokens"]}))
    return bundle


def _tcp_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.3)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def _alive(proc: ServiceProcess) -> bool:
    from triloop.devstack.processes import recorded_process

    return recorded_process(proc.pid_path) is not None
