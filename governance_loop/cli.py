"""``triloop governance ...``: environment versions, eval sets, thresholds, production, admission.

Most commands run on the server with the governance service's own credentials: each
write asks OPA as the governance service and is audited with the operating-system
account that ran the command (``user@host``), which is a label, not a proven person.
A decision that belongs to a person is not taken that way: registering an environment
version (``env register``), creating an eval set (``eval-set create``), setting a threshold
(``threshold set``) and admitting a task (``admit --decision``) go through the web
API with that person's token (TRILOOP_TOKEN), where the web service authenticates them
and records the decision that governance then reads and carries out.
"""

from __future__ import annotations

import asyncio
import dataclasses
import getpass
import json
import socket
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from sqlalchemy import Engine

from triloop.cli_output import OutputFormat, OutputOption, print_json
from triloop.config import Settings, get_settings
from triloop.policy import Authorizer, PolicyDenied

governance_app = typer.Typer(help="Governance: versions, eval sets, thresholds, production.",
                             no_args_is_help=True)
env_app = typer.Typer(help="Immutable environment versions.", no_args_is_help=True)
eval_set_app = typer.Typer(help="Frozen, versioned eval sets.", no_args_is_help=True)
threshold_app = typer.Typer(help="Versioned gate thresholds.", no_args_is_help=True)
task_app = typer.Typer(help="Tasks (an environment version and a seed).", no_args_is_help=True)
governance_app.add_typer(env_app, name="env")
governance_app.add_typer(eval_set_app, name="eval-set")
governance_app.add_typer(threshold_app, name="threshold")
governance_app.add_typer(task_app, name="task")

TokenOption = Annotated[
    str | None, typer.Option("--token", envvar="TRILOOP_TOKEN", help="The operator's API token.")
]
ApiOption = Annotated[str, typer.Option("--api-url", envvar="TRILOOP_API_URL",
                                        help="Base URL of the web API.")]


def _adapters() -> tuple[Settings, Engine, Authorizer]:
    from triloop.db import role_engine
    from triloop.wiring import build_authorizer

    settings = get_settings()
    return settings, role_engine(settings, "governance"), build_authorizer(settings, "governance")


def _who() -> tuple[str, list[str]]:
    """The operating-system account running the command: a label for the audit log only."""
    return f"{getpass.getuser()}@{socket.gethostname()}", []


def _fail(error: Exception) -> typer.Exit:
    typer.echo(f"error: {error}", err=True)
    return typer.Exit(1)


def _run(action: Any) -> Any:
    """Run one command body, turning refusals into a message and exit code 1."""
    from governance_loop.evalsets import EvalSetError
    from governance_loop.gates import ThresholdSpecError
    from governance_loop.store import StoreError
    from triloop.contract_diff import ContractDiffError

    try:
        return action()
    except (PolicyDenied, StoreError, EvalSetError, ThresholdSpecError, ContractDiffError,
            ValueError, OSError, LookupError) as error:
        raise _fail(error) from error


@env_app.command("register")
def env_register(
    file: Annotated[Path, typer.Argument(help="Contract YAML file.")],
    name: Annotated[str | None, typer.Option(help="Environment name (default: task).")] = None,
    comment: Annotated[str, typer.Option(help="Why (kept with the decision).")] = "",
    output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = "http://127.0.0.1:8000",
) -> None:
    """Register a contract as a new version (identical content returns the same version).

    The contract and the fixture files it lists go to POST /api/environments with the
    operator's token: the web service proves who registers, and governance writes the
    version for them. Every problem in the contract is printed and nothing is registered.
    """
    from triloop.contract_upload import pack_contract_file

    try:
        text, fixtures, task = pack_contract_file(file)
    except (OSError, UnicodeDecodeError) as error:
        raise _fail(ValueError(f"cannot read {file}: {error}")) from error
    body = _post_as_person("/api/environments", {
        "name": name or task or file.stem, "contract_yaml": text, "fixtures": fixtures,
        "comment": comment}, token, api_url, source=str(file))
    if output is OutputFormat.json:
        print_json(body)
        return
    state = "registered" if body["created"] else "already registered"
    typer.echo(f"{state}: {body['environment']} v{body['version']} {body['version_id']}")


def _post_as_person(path: str, payload: dict[str, Any], token: str | None, api_url: str, *,
                    source: str = "") -> dict[str, Any]:
    """POST to the web API with the person's token; a refusal prints each reason, exit 1."""
    import httpx

    if not token:
        raise _fail(ValueError("this needs your API token (--token or TRILOOP_TOKEN): the"
                               " web service proves who acts"))
    try:
        response = httpx.request("POST", f"{api_url.rstrip('/')}{path}", json=payload,
                                 headers={"Authorization": f"Bearer {token}"}, timeout=120)
    except httpx.HTTPError as exc:
        raise _fail(RuntimeError(f"cannot reach the web API at {api_url}: {exc}")) from exc
    try:
        body: dict[str, Any] = response.json() if response.content else {}
    except ValueError:
        body = {"detail": response.text[:500]}
    if response.status_code >= 400:
        prefix = f"{source}: " if source else ""
        for reason in body.get("reasons") or []:
            typer.echo(f"{prefix}{reason}", err=True)
        raise _fail(RuntimeError(f"the API refused ({response.status_code}):"
                                 f" {body.get('detail', '')}".strip()))
    return body


@env_app.command("diff")
def env_diff(
    a: Annotated[str, typer.Argument(help="Version id, NAME@N, NAME, or a contract file.")],
    b: Annotated[str, typer.Argument(help="Version id, NAME@N, NAME, or a contract file.")],
) -> None:
    """Show what changed from A to B (contract fields, fixture hashes and code hashes)."""
    from governance_loop.environments import comparable, document_from_file, resolve_version
    from triloop.contract_diff import diff_contracts, render_diff
    from triloop.db import session_scope

    _, engine, _ = _adapters()

    def load(ref: str) -> dict[str, Any]:
        path = Path(ref)
        if path.is_file():
            doc = document_from_file(path)
            return comparable(doc.contract, doc.fixture_hashes, doc.code_hashes)
        with session_scope(engine) as session:
            row = resolve_version(session, ref)
            return comparable(row.contract, row.fixture_hashes, row.code_hashes)

    typer.echo(render_diff(_run(lambda: diff_contracts(load(a), load(b)))))


@env_app.command("retire")
def env_retire(
    version_id: Annotated[str, typer.Argument(help="Environment version id.")],
) -> None:
    """Retire a version: no new tasks or runs; the lineage of old ones is kept."""
    from governance_loop.environments import retire_environment_version

    _, engine, authorizer = _adapters()
    user, roles = _who()
    result = _run(lambda: retire_environment_version(
        engine=engine, authorizer=authorizer, version_id=version_id, requested_by=user,
        roles=roles))
    typer.echo(f"retired: {result.environment_name} v{result.version} {result.id}")


@task_app.command("add")
def task_add(
    version: Annotated[str, typer.Argument(help="Environment version id or NAME@N.")],
    seed: Annotated[int, typer.Option(help="The task's seed.")],
) -> None:
    """Create a pending task; it is usable only after `admit`."""
    from governance_loop.environments import add_task

    _, engine, authorizer = _adapters()
    user, roles = _who()
    task_id = _run(lambda: add_task(engine=engine, authorizer=authorizer, version_ref=version,
                                    seed=seed, requested_by=user, roles=roles))
    typer.echo(task_id)


@eval_set_app.command("create")
def eval_set_create(
    name: Annotated[str, typer.Argument(help="Eval set name; each call makes a new version.")],
    task: Annotated[list[str], typer.Option("--task", help="Admitted task id; repeat.")],
    comment: Annotated[str, typer.Option(help="Why (kept with the decision).")] = "",
    output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = "http://127.0.0.1:8000",
) -> None:
    """Create and freeze the next version of an eval set from admitted tasks.

    Sent to POST /api/eval-sets with the operator's token; governance writes it for them.
    """
    body = _post_as_person("/api/eval-sets", {"name": name, "task_ids": task,
                                              "comment": comment}, token, api_url)
    if output is OutputFormat.json:
        print_json(body)
        return
    typer.echo(f"{body['name']} v{body['version']} {body['eval_set_id']}"
               f" hash={body['content_hash']}")


@threshold_app.command("set")
def threshold_set(
    name: Annotated[str, typer.Argument(help="Threshold name (promotions use 'promotion').")],
    spec: Annotated[str, typer.Option(help="ThresholdSpec as JSON (version is assigned).")],
    eval_set: Annotated[str | None, typer.Option(
        help="Default frozen eval set id or name (newest): for environments that"
             " --eval-set-for does not name.")] = None,
    eval_set_for: Annotated[list[str] | None, typer.Option(
        "--eval-set-for", help="ENV=EVAL_SET: a candidate trained on environment ENV (a name"
        " or a version id) is judged on this frozen eval set; repeat for more sets or"
        " environments.")] = None,
    comment: Annotated[str, typer.Option(help="Why (kept with the decision).")] = "",
    output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = "http://127.0.0.1:8000",
) -> None:
    """Store the next version of a threshold.

    Sent to POST /api/thresholds with the operator's token; governance checks the spec and
    the eval sets, and writes it for them. A candidate is judged on the eval sets of the
    environments it was trained on, and must pass every one.
    """
    try:
        parsed = json.loads(spec)
    except json.JSONDecodeError as error:
        raise _fail(ValueError(f"--spec is not JSON: {error}")) from error
    per_environment: dict[str, list[str]] = {}
    for pair in eval_set_for or []:
        environment, _, named = pair.partition("=")
        if not environment or not named:
            raise _fail(ValueError(f"--eval-set-for {pair!r}: write ENV=EVAL_SET"))
        per_environment.setdefault(environment, []).append(named)
    if eval_set is None and not per_environment:
        raise _fail(ValueError("name an eval set: --eval-set, --eval-set-for ENV=SET, or both"))
    request: dict[str, object] = {"name": name, "spec": parsed, "eval_set": eval_set,
                                  "comment": comment}
    if per_environment:
        request["eval_sets"] = per_environment
    body = _post_as_person("/api/thresholds", request, token, api_url)
    if output is OutputFormat.json:
        print_json(body)
        return
    per = "".join(f" {env}={','.join(ids)}" for env, ids in (body.get("eval_sets") or {}).items())
    typer.echo(f"{body['name']} v{body['version']} {body['threshold_id']}"
               f" eval_set={body['eval_set_id']}{per}")


@governance_app.command("bootstrap-production")
def bootstrap(
    checkpoint_id: Annotated[str, typer.Argument(help="Checkpoint to serve production.")],
    replace: Annotated[bool, typer.Option(help="Replace an existing deployment (dev).")] = False,
) -> None:
    """Deploy a base checkpoint as production (the first deployment)."""
    from governance_loop.activities.rollback import bootstrap_production

    _, engine, authorizer = _adapters()
    user, roles = _who()
    result = _run(lambda: bootstrap_production(
        engine=engine, authorizer=authorizer, checkpoint_id=checkpoint_id, requested_by=user,
        roles=roles, replace=replace))
    typer.echo(f"production -> {result.checkpoint_id}")


class DecisionChoice(StrEnum):
    """What an operator may decide about an assessed task."""

    approve = "approve"
    reject = "reject"


@governance_app.command("admit")
def admit(
    task_id: Annotated[str, typer.Argument(help="Task to assess.")],
    decision: Annotated[DecisionChoice | None, typer.Option(
        help="The operator's decision, sent through the web API with --token.")] = None,
    comment: Annotated[str, typer.Option(help="Why (required with --decision).")] = "",
    wait: Annotated[float, typer.Option(help="Seconds to wait for the assessment.")] = 120.0,
    output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = "http://127.0.0.1:8000",
) -> None:
    """Start (or join) a task's assessment and print the four answers; --decision decides.

    While it waits, a progress line goes to stderr for each answer and every 10 s.

    The assessment is governance's own work. A decision is the operator's: it goes to
    POST /api/tasks/TASK/admission with their token, so the web service proves who they are.
    """
    settings, _, authorizer = _adapters()
    user, roles = _who()
    from governance_loop.environments import GOVERNANCE, requested_by_context
    from triloop.policy import Resource

    _run(lambda: authorizer.authorize(GOVERNANCE, "update", Resource("task", id=task_id),
                                      context=requested_by_context(user, roles)))
    result = asyncio.run(_assess(settings, task_id, user, wait))
    if decision is not None:
        if not comment.strip():
            raise _fail(ValueError("--comment is required with --decision: say why"))
        result = _decide_through_api(task_id, decision.value, comment, token, api_url)
    if output is OutputFormat.json:
        print_json(dataclasses.asdict(result))
        return
    typer.echo(f"task {result.task_id}: {result.status} (admissible={result.admissible})")
    for reason in result.reasons:
        typer.echo(f"  {reason}")


def _decide_through_api(task_id: str, decision: str, comment: str, token: str | None,
                        api_url: str) -> Any:
    import httpx

    from triloop.workflow_api import AdmissionResult

    if not token:
        raise _fail(ValueError("a decision needs the operator's API token (--token or"
                               " TRILOOP_TOKEN): the web service proves who decides"))
    try:
        response = httpx.post(f"{api_url.rstrip('/')}/api/tasks/{task_id}/admission",
                              json={"decision": decision, "comment": comment},
                              headers={"Authorization": f"Bearer {token}"}, timeout=120)
    except httpx.HTTPError as exc:
        raise _fail(RuntimeError(f"cannot reach the web API at {api_url}: {exc}")) from exc
    body = response.json() if response.content else {}
    if response.status_code != 200:
        reasons = "; ".join(body.get("reasons") or [])
        raise _fail(RuntimeError(f"the API refused ({response.status_code}):"
                                 f" {body.get('detail', '')} {reasons}".strip()))
    return AdmissionResult(task_id=body["task_id"], status=body["status"],
                           admissible=body.get("admissible"), reasons=body.get("reasons", []),
                           decided_by=body.get("decided_by"))


async def _assess(settings: Settings, task_id: str, user: str, wait: float) -> Any:
    from temporalio.common import WorkflowIDConflictPolicy

    from triloop.temporal import connect
    from triloop.workflow_api import (
        ADMISSION_STATUS_QUERY,
        ADMISSION_WORKFLOW,
        GOVERNANCE_QUEUE,
        AdmissionInput,
        AdmissionResult,
        admission_workflow_id,
    )

    client = await connect(settings, identity=f"governance-cli:{user}", service="governance")
    handle = await client.start_workflow(
        ADMISSION_WORKFLOW, AdmissionInput(task_id=task_id, requested_by=user),
        id=admission_workflow_id(task_id), task_queue=settings.task_queue(GOVERNANCE_QUEUE),
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    loop = asyncio.get_running_loop()
    started = loop.time()
    report = AssessmentProgress(task_id, every_s=PROGRESS_EVERY_S)
    result: AdmissionResult = await handle.query(ADMISSION_STATUS_QUERY,
                                                 result_type=AdmissionResult)
    while result.status == "assessing" and loop.time() < started + wait:
        report.show(result, loop.time() - started)
        await asyncio.sleep(0.5)
        result = await handle.query(ADMISSION_STATUS_QUERY, result_type=AdmissionResult)
    report.show(result, loop.time() - started, final=True)
    return result


# A line at least this often while the assessment runs, so a script's log shows it lives.
PROGRESS_EVERY_S = 10.0


class AssessmentProgress:
    """Progress lines on stderr: each new answer or status, and a heartbeat in between."""

    def __init__(self, task_id: str, *, every_s: float) -> None:
        self.task_id, self.every_s = task_id, every_s
        self.seen_reasons, self.last_status, self.last_line_at = 0, "", -every_s

    def show(self, result: Any, elapsed_s: float, *, final: bool = False) -> None:
        """Print what changed since the last call (or a heartbeat when it is due)."""
        from triloop.cli_output import progress

        changed = result.status != self.last_status or len(result.reasons) > self.seen_reasons
        if not (changed or final or elapsed_s - self.last_line_at >= self.every_s):
            return
        for reason in result.reasons[self.seen_reasons:]:
            progress(f"task {self.task_id}: {reason}")
        self.seen_reasons = len(result.reasons)
        if final and result.status == "assessing":
            progress(f"task {self.task_id}: still assessing after {elapsed_s:.0f} s; run"
                     " `admit` again to keep waiting (the assessment goes on)")
        elif changed or not final:
            progress(f"task {self.task_id}: {result.status} ({elapsed_s:.0f} s,"
                     f" {self.seen_reasons} answer(s) so far)")
        self.last_status, self.last_line_at = result.status, elapsed_s
