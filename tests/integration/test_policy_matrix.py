"""The whole permission matrix against the real OPA server, through ``Authorizer``.

Every "never" of issue 3, the separation-of-duties cases, unknown kinds, case and
whitespace variants; OPA stopped denies everything while the sink still records it;
every decision reaches the sink with OPA's decision id; a policy edit applies to the
next call; a bundle's revision reaches the decision.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from triloop.config import Settings
from triloop.devstack.processes import (
    ServiceProcess,
    free_port,
    start_process,
    stop_recorded,
    wait_until,
)
from triloop.devstack.servers import repo_root, start_opa, tool_path
from triloop.policy import Actor, Authorizer, Decision, OpaClient, PolicyDenied, Resource

pytestmark = pytest.mark.integration

LEARNING, EXECUTION, GOVERNANCE = Actor("learning"), Actor("execution"), Actor("governance")
UMA = Actor("web", "uma", ("ml_engineer",))
OLGA = Actor("web", "olga", ("operator",))
ADA = Actor("web", "ada", ("auditor",))
ROOT = Actor("web", "root", ("admin",))
DUTIES = {"submitted_by": "sam", "audited_by": "ada"}
RELEASED = {**DUTIES, "approved_by": "olga"}
# Role age (issue 19 item 2): governance sends when the promotion opened and, for the person,
# when their role became active; both read from PostgreSQL.
OPENED = "2026-06-01T00:00:00.000000Z"
OPEN_DUTIES = {**DUTIES, "promotion_opened_at": OPENED}
BEA = Actor("web", "bea", ("admin",))


@dataclass(frozen=True)
class Case:
    """One row of the matrix: who does what to what, and the expected answer."""

    actor: Actor
    action: str
    resource: Resource
    allow: bool
    why: str
    context: Mapping[str, Any] | None = field(default=None)

    @property
    def id(self) -> str:
        who = self.actor.user or self.actor.service
        return f"{who}-{self.action}-{self.resource.kind}-{'allow' if self.allow else 'deny'}"


def _deny(actor: Actor, action: str, kind: str, why: str, **kw: Any) -> Case:
    return Case(actor, action, Resource(kind, "r-1", **kw), False, why)


def _allow(actor: Actor, action: str, kind: str, why: str, **kw: Any) -> Case:
    return Case(actor, action, Resource(kind, "r-1", **kw), True, why)


def _for(person: Actor, since: str | None = "2026-01-01T00:00:00.000000Z") -> dict[str, Any]:
    behalf: dict[str, Any] = {"user": person.user, "roles": list(person.roles)}
    if since is not None:
        behalf["role_since"] = since
    return {"on_behalf_of": behalf}


WRITES = ("create", "update", "delete")
JUDGING = ("eval_set", "eval_item", "threshold", "promotion", "approval", "deployment", "routing")

NEVER = [
    # learning never writes what judges it (rollback targets live in deployment)
    *(_deny(LEARNING, a, k, f"may never {a} {k}") for k in JUDGING for a in WRITES),
    *(
        _deny(LEARNING, a, k, f"may never {a}", attrs=RELEASED)
        for a, k in [
            ("approve", "promotion"),
            ("promote", "promotion"),
            ("sign_audit", "promotion"),
            ("rollback", "deployment"),
            ("route", "routing"),
        ]
    ),
    # ... nor an environment version or its reward rule
    *(
        _deny(LEARNING, a, k, "belong to governance")
        for a, k in [
            ("update", "environment"),
            ("update", "environment_version"),
            ("freeze", "environment_version"),
            ("delete", "environment_version"),
        ]
    ),
    _deny(LEARNING, "read", "eval_item", "never read eval items"),
    # execution never changes contracts, eval sets or thresholds
    *(
        _deny(EXECUTION, a, k, f"never {a} {k}")
        for k in (
            "environment",
            "environment_version",
            "task",
            "eval_set",
            "eval_item",
            "threshold",
        )
        for a in WRITES
    ),
    # governance never trains or edits a checkpoint
    *(
        _deny(GOVERNANCE, a, k, "governance never trains")
        for k in ("checkpoint", "training_step")
        for a in WRITES
    ),
    # nobody edits the audit log; admins never approve
    *(_deny(a, "update", "audit_event", "append-only") for a in (GOVERNANCE, ADA, ROOT)),
    _deny(
        Actor("web", "root", ("admin", "operator")),
        "approve",
        "promotion",
        "admins manage users and may never approve",
        attrs=DUTIES,
    ),
]

ALLOWED_LOOPS = [
    _allow(LEARNING, "create", "checkpoint", "service learning may create checkpoint"),
    _allow(LEARNING, "create", "training_step", "may create training_step"),
    _allow(LEARNING, "read", "trajectory", "may read trajectory"),
    _allow(LEARNING, "propose", "proposal", "may propose proposal"),
    _allow(LEARNING, "pause", "training_run", "may pause training_run"),
    _allow(EXECUTION, "create", "trajectory", "may create trajectory"),
    _allow(EXECUTION, "create", "step", "may create step"),
    _allow(EXECUTION, "read", "environment_version", "may read environment_version"),
    _allow(GOVERNANCE, "admit", "task", "may admit task"),
    _allow(GOVERNANCE, "freeze", "eval_set", "may freeze eval_set"),
    _allow(GOVERNANCE, "create", "threshold", "may create threshold"),
    _allow(GOVERNANCE, "create", "gate_result", "may create gate_result"),
    _allow(GOVERNANCE, "promote", "promotion", "may promote promotion", attrs=RELEASED),
    _allow(GOVERNANCE, "rollback", "deployment", "may rollback deployment"),
    _allow(GOVERNANCE, "route", "routing", "may route routing"),
    _allow(GOVERNANCE, "create", "deployment", "may create deployment"),
]

PEOPLE = [
    _allow(UMA, "submit", "training_run", "role ml_engineer may submit", owner="uma"),
    _allow(UMA, "cancel", "training_run", "role ml_engineer may cancel", owner="uma"),
    _deny(UMA, "cancel", "training_run", "only their own runs", owner="vic"),
    _deny(UMA, "pause", "training_run", "needs resource.owner"),
    _deny(UMA, "approve", "promotion", "no rule lets user uma", attrs=DUTIES),
    _deny(UMA, "read", "eval_item", "no rule lets user uma"),
    _allow(OLGA, "approve", "promotion", "role operator may approve", attrs=DUTIES),
    _allow(OLGA, "reject", "promotion", "role operator may reject", attrs=DUTIES),
    _allow(OLGA, "rollback", "deployment", "role operator may rollback"),
    _deny(OLGA, "sign_audit", "promotion", "no rule lets user olga", attrs=DUTIES),
    _allow(ADA, "sign_audit", "promotion", "role auditor may sign_audit", attrs=DUTIES),
    _allow(ADA, "verify", "audit_event", "role auditor may verify"),
    _allow(ADA, "read", "checkpoint", "role auditor may read"),
    _allow(ROOT, "create", "user", "role admin may create user"),
    Case(ROOT, "update", Resource("user", "root"), False, "may not update their own user record"),
    # Game-day faults: an operator's act through the web service, never a loop's.
    _allow(OLGA, "inject_fault", "serving_fault", "role operator may inject_fault"),
    _allow(OLGA, "clear_fault", "serving_fault", "role operator may clear_fault"),
    _deny(UMA, "inject_fault", "serving_fault", "no rule lets user uma"),
    _deny(ADA, "clear_fault", "serving_fault", "no rule lets user ada"),
    *(_deny(loop, "inject_fault", "serving_fault", "only by an operator through the web service")
      for loop in (LEARNING, EXECUTION, GOVERNANCE)),
    Case(GOVERNANCE, "inject_fault", Resource("serving_fault", "c"), False,
         "only by an operator through the web service", _for(OLGA)),
]

DUTY_CASES = [
    _deny(
        Actor("web", "sam", ("operator",)),
        "approve",
        "promotion",
        "sam submitted the run and may not approve",
        attrs=DUTIES,
    ),
    _deny(
        Actor("web", "sam", ("auditor",)),
        "sign_audit",
        "promotion",
        "sam submitted the run and may not sign_audit",
        attrs=DUTIES,
    ),
    _deny(
        Actor("web", "ada", ("operator", "auditor")),
        "approve",
        "promotion",
        "ada signed the audit and may not also approve",
        attrs=DUTIES,
    ),
    _deny(
        OLGA, "approve", "promotion", "needs a signed audit first", attrs={"submitted_by": "sam"}
    ),
    _deny(
        OLGA,
        "approve",
        "promotion",
        "needs resource.attrs.submitted_by",
        attrs={"audited_by": "ada"},
    ),
    _deny(
        GOVERNANCE,
        "promote",
        "promotion",
        "the audit and the approval were given by the same",
        attrs={**DUTIES, "approved_by": "ADA "},
    ),
    _deny(
        GOVERNANCE, "promote", "promotion", "promote needs resource.attrs.approved_by", attrs=DUTIES
    ),
    Case(
        GOVERNANCE,
        "approve",
        Resource("promotion", "p", attrs=OPEN_DUTIES),
        True,
        "governance may approve promotion for olga",
        _for(OLGA),
    ),
    Case(
        GOVERNANCE,
        "approve",
        Resource("promotion", "p", attrs=OPEN_DUTIES),
        False,
        "olga's role became active at 2026-06-01T00:00:00.000001Z, after the promotion opened",
        _for(OLGA, since="2026-06-01T00:00:00.000001Z"),
    ),
    Case(
        GOVERNANCE,
        "sign_audit",
        Resource("promotion", "p", attrs={"submitted_by": "sam"}),
        False,
        "sign_audit needs resource.attrs.promotion_opened_at",
        _for(ADA),
    ),
    Case(
        GOVERNANCE,
        "sign_audit",
        Resource("promotion", "p", attrs=OPEN_DUTIES),
        False,
        "sign_audit needs context.on_behalf_of.role_since",
        _for(ADA, since=None),
    ),
    # Two-person role grants: the requester never decides their own request.
    _deny(ROOT, "confirm", "role_grant", "two-person rule: root requested this role grant",
          attrs={"requested_by": "root"}),
    _deny(ROOT, "refuse", "role_grant", "root requested this role grant and may not refuse",
          attrs={"requested_by": " Root"}),
    _deny(BEA, "confirm", "role_grant", "confirm a role grant needs resource.attrs.requested_by"),
    _allow(BEA, "confirm", "role_grant", "role admin may confirm role_grant",
           attrs={"requested_by": "root"}),
    _deny(OLGA, "confirm", "role_grant", "no rule lets user olga", attrs={"requested_by": "root"}),
    Case(
        GOVERNANCE,
        "approve",
        Resource("promotion", "p", attrs=DUTIES),
        False,
        "sam submitted the run",
        _for(Actor("web", "sam", ("operator",))),
    ),
    Case(
        LEARNING,
        "cancel",
        Resource("training_run", "r", owner="uma"),
        True,
        "learning may cancel training_run for uma",
        _for(UMA),
    ),
    Case(
        LEARNING,
        "approve",
        Resource("promotion", "p", attrs=DUTIES),
        False,
        "learning loop may never approve",
        _for(OLGA),
    ),
]

VOCABULARY = [
    _deny(LEARNING, "read", "checkpoints", 'unknown resource kind "checkpoints"'),
    _deny(LEARNING, "read", "eval-set", 'unknown resource kind "eval-set"'),
    _deny(LEARNING, "read", "", 'unknown resource kind ""'),
    _deny(LEARNING, "train", "checkpoint", 'unknown action "train"'),
    _deny(Actor("billing"), "read", "task", 'unknown service "billing"'),
    _deny(Actor("web"), "read", "task", "acts only for a signed-in user"),
    _allow(Actor(" Learning "), "CREATE ", "\tCheckPoint", "may create checkpoint"),
    _deny(Actor("LEARNING"), " Create", "EVAL_SET ", "may never create eval_set"),
    _deny(Actor("learning"), "update", " Eval_Item", "may never update eval_item"),
    _allow(
        Actor("web", "olga", (" Operator",)),
        "  APPROVE",
        "Promotion ",
        "role operator may approve",
        attrs={"submitted_by": "Sam", "audited_by": "ada"},
    ),
    _deny(
        Actor("web", "Sam ", ("operator",)),
        "approve",
        "promotion",
        "sam submitted the run",
        attrs=DUTIES,
    ),
]

CASES = [*NEVER, *ALLOWED_LOOPS, *PEOPLE, *DUTY_CASES, *VOCABULARY]


class RecordingSink:
    """The audit sink: remembers every decision it is handed."""

    def __init__(self) -> None:
        self.records: list[tuple[Actor, str, Resource, Decision, Mapping[str, Any] | None]] = []

    def __call__(
        self,
        actor: Actor,
        action: str,
        resource: Resource,
        decision: Decision,
        context: Mapping[str, Any] | None,
    ) -> None:
        self.records.append((actor, action, resource, decision, context))


def _run(authorizer: Authorizer, case: Case) -> Decision:
    try:
        return authorizer.authorize(case.actor, case.action, case.resource, context=case.context)
    except PolicyDenied as denied:
        return denied.decision


@pytest.fixture(scope="module")
def opa(opa_url: str, opa_tokens: dict[str, str]) -> Iterator[OpaClient]:
    """One client for the session OPA holding every service's token (the test plays all)."""
    client = OpaClient(opa_url, tokens=opa_tokens)
    yield client
    client.close()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_matrix(opa: OpaClient, opa_tokens: dict[str, str], case: Case) -> None:
    sink = RecordingSink()
    decision = _run(Authorizer(opa, sink), case)
    assert decision.allow is case.allow, decision.reasons
    if case.actor.service.strip().lower() not in opa_tokens:
        # No service holds a token for this name: OPA's own authentication refuses first.
        assert decision.reasons == ("failed closed: OPA answered HTTP 401: request rejected"
                                    " by administrative policy",)
        return
    assert any(case.why in reason for reason in decision.reasons), decision.reasons
    assert decision.decision_id, "OPA issues an id for every decision (decision logging on)"
    assert sink.records == [(case.actor, case.action, case.resource, decision, case.context)]


async def test_every_decision_reaches_the_sink_even_concurrently(opa: OpaClient) -> None:
    sink = RecordingSink()
    authorizer = Authorizer(opa, sink)
    semaphore = asyncio.Semaphore(16)

    async def one(case: Case) -> Decision:
        async with semaphore:
            try:
                return await authorizer.authorize_async(
                    case.actor, case.action, case.resource, context=case.context
                )
            except PolicyDenied as denied:
                return denied.decision

    decisions = await asyncio.gather(*(one(case) for case in CASES))
    assert [d.allow for d in decisions] == [case.allow for case in CASES]
    assert len(sink.records) == len(CASES)
    recorded_ids = {record[3].decision_id for record in sink.records}
    assert recorded_ids == {d.decision_id for d in decisions}
    assert len(recorded_ids) == len(CASES)


def _tokens(tmp: Path) -> dict[str, str]:
    return Settings(home=tmp).opa_tokens()


def _start_private_opa(tmp: Path, *extra: str, policies: Path) -> tuple[ServiceProcess, str]:
    port = free_port()
    if not extra:
        proc = start_opa(policies=policies, port=port, run_dir=tmp, log_dir=tmp,
                         secrets_dir=tmp / "secrets")
        return proc, f"http://127.0.0.1:{port}"
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
        *extra,
        str(policies),
    ]
    proc = start_process("opa-bundle", argv, run_dir=tmp, log_dir=tmp)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return httpx.get(f"{url}/health", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(healthy, name="opa-bundle", log_path=proc.log_path, timeout_s=30)
    return proc, url


def test_opa_stopped_denies_everything_and_the_sink_records_it(tmp_path: Path) -> None:
    proc, url = _start_private_opa(tmp_path, policies=repo_root() / "policies")
    client = OpaClient(url, tokens=_tokens(tmp_path), timeout_s=1.0)
    sink = RecordingSink()
    authorizer = Authorizer(client, sink)
    try:
        assert _run(authorizer, ALLOWED_LOOPS[0]).allow is True
    finally:
        stop_recorded(proc.pid_path)
    sink.records.clear()
    for case in CASES:
        with pytest.raises(PolicyDenied, match="failed closed"):
            authorizer.authorize(case.actor, case.action, case.resource, context=case.context)
    client.close()
    assert len(sink.records) == len(CASES)
    assert all(not record[3].allow for record in sink.records)


def test_a_policy_edit_applies_when_opa_restarts_and_its_revision_is_audited(
    tmp_path: Path, role_engine: Any, owner_engine: Any,
) -> None:
    from triloop.audit import DatabaseAuditSink

    policies = tmp_path / "policies"
    shutil.copytree(repo_root() / "policies", policies)
    proc, url = _start_private_opa(tmp_path, policies=policies)
    case = ALLOWED_LOOPS[0]  # learning creates a checkpoint
    learning = role_engine("learning")
    # Learning writes the audit log but may not read it (migration 0022): read as the owner.
    with owner_engine.connect() as conn:
        start = conn.execute(text("SELECT COALESCE(max(seq), 0) FROM audit_event")).scalar_one()
    authorizer = Authorizer(OpaClient(url, tokens=_tokens(tmp_path)), DatabaseAuditSink(learning))
    before = authorizer.authorize(case.actor, case.action, case.resource)
    grants = policies / "triloop" / "authz" / "grants.rego"
    grants.write_text(grants.read_text().replace(
        '"checkpoint": {"read", "create", "propose", "delete"}',
        '"checkpoint": {"read", "propose", "delete"}'))
    # Without --watch nothing changes until OPA restarts, so no decision is ever reported
    # under a revision other than the one that made it.
    assert authorizer.authorize(case.actor, case.action, case.resource).policy_revision == \
        before.policy_revision
    stop_recorded(proc.pid_path)
    port = int(url.rsplit(":", 1)[1])
    proc = start_opa(policies=policies, port=port, run_dir=tmp_path, log_dir=tmp_path,
                     secrets_dir=tmp_path / "secrets", name="opa-again")
    try:
        with pytest.raises(PolicyDenied) as refused:
            authorizer.authorize(case.actor, case.action, case.resource)
    finally:
        stop_recorded(proc.pid_path)
    after = refused.value.decision.policy_revision
    assert after is not None and after != before.policy_revision
    with owner_engine.connect() as conn:
        changes = conn.execute(text(
            "SELECT payload FROM audit_event WHERE action = 'policy_revision_changed'"
            " AND seq > :start AND db_role = 'triloop_learning' AND resource->>'id' IN (:a, :b)"
            " ORDER BY seq"), {"a": before.policy_revision, "b": after, "start": start}
        ).scalars().all()
    assert [(c["old"], c["new"]) for c in changes] == [
        (None, before.policy_revision), (before.policy_revision, after)]


def test_bundle_revision_reaches_the_decision(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(repo_root() / "policies", bundle)
    manifest = {"revision": "rev-42", "roots": ["triloop", "system/authz", "system/authz_test"]}
    (bundle / ".manifest").write_text(json.dumps(manifest))
    proc, url = _start_private_opa(tmp_path, "--bundle", policies=bundle)
    try:
        with OpaClient(url) as client:
            decision = client.decide(LEARNING, "create", Resource("checkpoint"))
    finally:
        stop_recorded(proc.pid_path)
    assert decision.allow is True
    assert decision.policy_revision == "rev-42"


def test_a_token_speaks_for_its_own_service_only(opa_url: str, opa_tokens: dict[str, str]
                                                 ) -> None:
    # The learning service's token, asking as governance (who may promote): OPA itself
    # refuses the query before any policy about promotions is evaluated.
    forged = OpaClient(opa_url, tokens={"governance": opa_tokens["learning"]})
    honest = OpaClient(opa_url, tokens=opa_tokens)
    governance = Actor("governance")
    promote = Resource("promotion", "p-1", attrs={
        "submitted_by": "ml", "audited_by": "auditor", "approved_by": "operator"})
    try:
        assert honest.decide(governance, "promote", promote).allow is True
        decision = forged.decide(governance, "promote", promote)
        assert decision.allow is False
        assert "HTTP 401" in decision.reasons[0] and "failed closed" in decision.reasons[0]
        anonymous = OpaClient(opa_url).decide(governance, "promote", promote)
        assert anonymous.allow is False and "HTTP 401" in anonymous.reasons[0]
    finally:
        forged.close()
        honest.close()


def test_opa_serves_nothing_but_decisions(opa_url: str, opa_tokens: dict[str, str]) -> None:
    bearer = {"authorization": f"Bearer {opa_tokens['web']}"}
    for path in ("/v1/data", "/v1/data/system/tokens", "/v1/policies", "/v1/data/triloop"):
        assert httpx.get(f"{opa_url}{path}", headers=bearer).status_code == 401, path
    assert httpx.get(f"{opa_url}/health").status_code == 200


def test_opa_runs_only_bundles_signed_with_the_stacks_key(tmp_path: Path) -> None:
    import subprocess

    from triloop.devstack.opa_bundles import build_signed, ensure_signing_key

    policies = tmp_path / "policies"
    shutil.copytree(repo_root() / "policies", policies)
    proc, url = _start_private_opa(tmp_path, policies=policies)  # signed and verified
    try:
        assert _run(Authorizer(OpaClient(url, tokens=_tokens(tmp_path)), RecordingSink()),
                    ALLOWED_LOOPS[0]).allow is True
    finally:
        stop_recorded(proc.pid_path)
    _, verification_key = ensure_signing_key(tmp_path / "secrets")
    foreign_key, _ = ensure_signing_key(tmp_path / "someone-else")
    opa = tool_path("opa")
    unsigned = tmp_path / "unsigned.tar.gz"
    subprocess.run([opa, "build", "--bundle", str(policies), "--output", str(unsigned)],
                   check=True, capture_output=True)
    foreign = build_signed(opa, policies, tmp_path / "foreign.tar.gz", foreign_key)
    for bundle, why in ((unsigned, "missing .signatures.json"), (foreign, "verification")):
        refused = subprocess.run(
            [opa, "run", "--server", "--addr", f"127.0.0.1:{free_port()}",
             "--verification-key", str(verification_key), "--bundle", str(bundle)],
            capture_output=True, text=True, timeout=30, check=False)
        assert refused.returncode != 0 and why in refused.stderr + refused.stdout, refused
