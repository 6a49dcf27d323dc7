"""``triloop governance ...``: environment versions, eval sets, thresholds, production, admission.

Most commands run on the server with the governance service's own credentials: each
write asks OPA as the governance service and is audited with the operating-system
account that ran the command (``user@host``), which is a label, not a proven person.
A decision that belongs to a person is not taken that way: registering an environment
version (``env register``), creating an eval set (``eval-set create``), setting a threshold
(``threshold set``), registering a task set (``task-set register``), admitting a task
(``admit --decision``) and admitting a task set (``task-set admit``) go through the web
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
task_set_app = typer.Typer(help="Task sets: versioned collections of tasks, split and admitted"
                                " as one unit.", no_args_is_help=True)
governance_app.add_typer(env_app, name="env")
governance_app.add_typer(eval_set_app, name="eval-set")
governance_app.add_typer(threshold_app, name="threshold")
governance_app.add_typer(task_app, name="task")
governance_app.add_typer(task_set_app, name="task-set")

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


def _post_as_person(path: str, payload: dict[str, Any] | None, token: str | None, api_url: str,
                    *, source: str = "", method: str = "POST") -> dict[str, Any]:
    """Call the web API with the person's token (a POST unless ``method`` says otherwise);
    a refusal prints each reason, exit 1."""
    import httpx

    if not token:
        raise _fail(ValueError("this needs your API token (--token or TRILOOP_TOKEN): the"
                               " web service proves who acts"))
    try:
        response = httpx.request(method, f"{api_url.rstrip('/')}{path}", json=payload,
                                 headers={"Authorization": f"Bearer {token}"}, timeout=600)
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


def task_use(task: dict[str, Any]) -> str:
    """What a run may do with the task: train on it, or not (held out, or not admitted)."""
    if task.get("held_out_in"):
        return f"held out (eval set {', '.join(task['held_out_in'])})"
    held = [f"{m['split']} split of {m['task_set']}" for m in task.get("splits") or []
            if m["split"] != "train"]
    if held:
        return f"held out ({', '.join(held)})"
    return "training" if task["status"] == "admitted" else f"not admitted ({task['status']})"


def _task_row(task: dict[str, Any]) -> dict[str, Any]:
    version = task.get("environment_version")
    return {
        "id": task["id"], "use": task_use(task),
        "environment": f"{task.get('environment') or '?'}@{version if version else '?'}",
        "seed": task["seed"], "status": task["status"],
        "splits": ", ".join(f"{m['task_set']}: {m['split']}" for m in task.get("splits") or []),
        "tags": ", ".join(f"{k}={v}" for k, v in sorted((task.get("tags") or {}).items())),
    }


@task_app.command("list")
def task_list(
    environment: Annotated[str | None, typer.Option(
        "--environment", help="Only tasks of this environment (its name).")] = None,
    status: Annotated[str | None, typer.Option(
        "--status", help="Only tasks in this status: pending, admitted or rejected.")] = None,
    split: Annotated[str | None, typer.Option(
        "--split", help="Only tasks in this split of a task set: train, eval or traffic.")
    ] = None,
    tag: Annotated[list[str] | None, typer.Option(
        "--tag", help="key=value: only tasks with this tag; repeat for all of several.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=200)] = 50,
    cursor: Annotated[str | None, typer.Option(
        "--cursor", help="The next page, as the previous page said.")] = None,
    output: OutputOption = OutputFormat.table,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (as --output json).")
                       ] = False,
    token: TokenOption = None, api_url: ApiOption = "http://127.0.0.1:8000",
) -> None:
    """Tasks, newest first: full id, environment@version, seed, status, what a run may use
    it for (training, or held out by a frozen eval set or a task set's eval or traffic
    split), splits and tags.

    A RUN.yaml's rollout.task_ids takes the ids (or unique prefixes) marked "training".
    Read from GET /api/tasks with your token; the next page's command goes to stderr.
    """
    from urllib.parse import urlencode

    from triloop.cli_output import field, print_rows, progress

    query: list[tuple[str, Any]] = [("limit", limit)]
    for name, value in (("environment", environment), ("status", status), ("split", split),
                        ("cursor", cursor)):
        if value:
            query.append((name, value))
    query += [("tag", t) for t in tag or []]
    page = _get_as_person(f"/api/tasks?{urlencode(query)}", token, api_url)
    if as_json:
        output = OutputFormat.json
    # Full ids, even on a terminal: they are what a RUN.yaml's rollout.task_ids is given.
    columns = (field("id", "id"), field("environment", "environment"),
               field("seed", "seed"), field("status", "status"), field("use", "use"),
               field("splits", "splits"), field("tags", "tags"))
    print_rows([_task_row(t) for t in page["items"]], columns, output, json_data=page)
    if page.get("next_cursor") and output is not OutputFormat.json:
        progress(f"more: triloop governance task list --cursor {page['next_cursor']}")


def _get_as_person(path: str, token: str | None, api_url: str) -> dict[str, Any]:
    """GET from the web API with the person's token; a refusal prints each reason, exit 1."""
    return _post_as_person(path, None, token, api_url, method="GET")


def _resolve_task(engine: Engine, ref: str) -> str:
    """The task id ``ref`` is or uniquely starts (as `train show` resolves run ids)."""
    from sqlmodel import Session, col, select

    from triloop.cli_output import pick_one
    from triloop.models import Task

    with Session(engine) as session:
        ids = list(session.exec(select(Task.id).where(col(Task.id).startswith(
            ref, autoescape=True)).order_by(col(Task.id)).limit(4)))
    return pick_one(ref, ids, "task")


@eval_set_app.command("create")
def eval_set_create(
    name: Annotated[str, typer.Argument(help="Eval set name; each call makes a new version.")],
    task: Annotated[list[str] | None, typer.Option(
        "--task", help="Admitted task id; repeat (or --from-task-set).")] = None,
    from_task_set: Annotated[str | None, typer.Option(
        help="An admitted task set (NAME@V, NAME, id prefix) whose eval split is frozen.")
    ] = None,
    split: Annotated[str, typer.Option(help="With --from-task-set: the split (eval only).")
                     ] = "eval",
    comment: Annotated[str, typer.Option(help="Why (kept with the decision).")] = "",
    output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = "http://127.0.0.1:8000",
) -> None:
    """Create and freeze the next version of an eval set from admitted tasks, or from the
    eval split of an admitted task set.

    Sent to POST /api/eval-sets with the operator's token; governance writes it for them.
    """
    if bool(task) == (from_task_set is not None):
        raise _fail(ValueError("give --task (repeat) or --from-task-set, exactly one"))
    payload: dict[str, Any] = {"name": name, "comment": comment}
    if from_task_set is not None:
        payload.update(from_task_set=from_task_set, split=split)
    else:
        payload["task_ids"] = task
    body = _post_as_person("/api/eval-sets", payload, token, api_url)
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
    task_id: Annotated[str, typer.Argument(help="Task to assess: its id or a unique prefix.")],
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
    settings, engine, authorizer = _adapters()
    user, roles = _who()
    task_id = _resolve_task(engine, task_id)
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


@task_set_app.command("admit")
def task_set_admit(
    task_set: Annotated[str, typer.Argument(help="Task set id, unique id prefix, or NAME@V.")],
    approve: Annotated[bool, typer.Option("--approve/--reject",
                                          help="Admit the set (only an admissible one) or"
                                               " reject it, with every pending task in it.")],
    comment: Annotated[str, typer.Option(help="Why (required; kept with the decision).")],
    output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = "http://127.0.0.1:8000",
) -> None:
    """Admit or reject an assessed task set with one decision.

    Sent to POST /api/task-sets/ID/admission with the operator's token: the web service
    proves who decides, and governance sets the set's status and every member task's.
    """
    if not comment.strip():
        raise _fail(ValueError("--comment is required: say why"))
    body = _post_as_person(f"/api/task-sets/{task_set}/admission", {
        "decision": "approve" if approve else "reject", "comment": comment}, token, api_url,
        source=task_set)
    if output is OutputFormat.json:
        print_json(body)
        return
    typer.echo(f"task set {body['task_set_id']}: {body['status']}"
               f" (admissible={body.get('admissible')}, {body.get('sample_size', 0)} of"
               f" {body.get('members', 0)} tasks sampled, seed {body.get('sample_seed')})")
    for failure in body.get("failures") or []:
        typer.echo(f"  {failure}")


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


@task_set_app.command("register")
def task_set_register(
    environment: Annotated[str, typer.Option(help="The environment version: NAME@N.")],
    name: Annotated[str, typer.Option(help="The set's name (lower case); versions count up.")],
    split: Annotated[str, typer.Option(help='The split rule as JSON, e.g. \'{"by": "fraction",'
                                            ' "train": 0.8, "eval": 0.1, "traffic": 0.1}\'')],
    dataset: Annotated[Path | None, typer.Option(help="A .jsonl or .parquet file.")] = None,
    generator: Annotated[str | None, typer.Option(
        help='The generator\'s params as JSON, e.g. \'{"count": 1000}\'.')] = None,
    seeds: Annotated[str | None, typer.Option(help="Seeds, e.g. 1,2,5-9.")] = None,
    tag: Annotated[list[str] | None, typer.Option(
        "--tag", help="key=value, the set's tag over the generator's; repeat.")] = None,
    comment: Annotated[str, typer.Option(help="Why (kept with the decision).")] = "",
    output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = "http://127.0.0.1:8000",
) -> None:
    """Register a task set from one source; its admission starts at once.

    Sent to POST /api/task-sets with the operator's token: the execution loop describes
    every task, governance splits and writes the set for them. Every problem (a malformed
    row, one item twice, an environment without a generator) is printed; nothing is written.
    """
    import base64

    from triloop.task_sources import TaskSourceError, parse_seeds, parse_tags

    if sum(source is not None for source in (dataset, generator, seeds)) != 1:
        raise _fail(ValueError("give exactly one of --dataset, --generator or --seeds"))
    try:
        payload: dict[str, Any] = {"name": name, "environment": environment,
                                   "split": json.loads(split), "tags": parse_tags(tag or []),
                                   "comment": comment}
        if dataset is not None:
            payload["dataset"] = {"filename": dataset.name, "content_base64":
                                  base64.b64encode(dataset.read_bytes()).decode()}
        elif generator is not None:
            payload["generator"] = json.loads(generator)
        else:
            payload["seeds"] = parse_seeds(str(seeds))
    except TaskSourceError as error:
        for problem in error.problems:
            typer.echo(problem, err=True)
        raise _fail(error) from error
    except (ValueError, OSError) as error:  # JSON, or the dataset file
        raise _fail(ValueError(f"cannot use the arguments: {error}")) from error
    body = _post_as_person("/api/task-sets", payload, token, api_url,
                           source=str(dataset) if dataset else "")
    if output is OutputFormat.json:
        print_json(body)
        return
    state = "registered" if body["created"] else "already registered"
    splits = ", ".join(f"{k} {v}" for k, v in sorted(body["splits"].items()))
    typer.echo(f"{state}: {body['name']} v{body['version']} {body['task_set_id']} ({splits};"
               f" {body['new_tasks']} new tasks); admission: {body['admission_workflow_id']}")


def _split_text(splits: dict[str, int]) -> str:
    return " ".join(f"{k}={splits[k]}" for k in ("train", "eval", "traffic") if k in splits)


@task_set_app.command("list")
def task_set_list(
    name: Annotated[str | None, typer.Option(help="Only the versions of this set.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=200)] = 50,
    cursor: Annotated[str | None, typer.Option(
        "--cursor", help="The next page, as the previous page said.")] = None,
    output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = "http://127.0.0.1:8000",
) -> None:
    """Task sets, newest first: name@version, status, source, splits."""
    from urllib.parse import urlencode

    from triloop.cli_output import Column, print_rows

    query = {"limit": limit, **({"cursor": cursor} if cursor else {}),
             **({"name": name} if name else {})}
    page = _post_as_person(f"/api/task-sets?{urlencode(query)}", None, token, api_url,
                           method="GET")
    columns = [Column("ID", lambda r: r["id"], is_id=True),
               Column("SET", lambda r: f"{r['name']}@{r['version']}"),
               Column("STATUS", lambda r: r["status"]),
               Column("SOURCE", lambda r: r["source_kind"]),
               Column("SPLITS", lambda r: _split_text(r["splits"])),
               Column("TAGS", lambda r: ",".join(f"{k}={v}" for k, v in r["tags"].items()))]
    print_rows(page["items"], columns, output, json_data=page)
    if page.get("next_cursor") and output is not OutputFormat.json:
        typer.echo(f"more: triloop governance task-set list --cursor {page['next_cursor']}",
                   err=True)


@task_set_app.command("show")
def task_set_show(
    ref: Annotated[str, typer.Argument(help="A set's id, unique id prefix, NAME@V or NAME.")],
    output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = "http://127.0.0.1:8000",
) -> None:
    """One task set: its source, split rule, tags, members per split, its first members."""
    from urllib.parse import quote

    body = _post_as_person(f"/api/task-sets/{quote(ref, safe='@')}", None, token, api_url,
                           method="GET")
    if output is OutputFormat.json:
        print_json(body)
        return
    typer.echo(f"{body['name']}@{body['version']} {body['id']} ({body['status']})")
    typer.echo(f"  environment: {body['environment']}@{body['environment_version']}")
    typer.echo(f"  source: {body['source_kind']} {json.dumps(body['source'])}")
    typer.echo(f"  split: {json.dumps(body['split_rule'])}: {_split_text(body['splits'])}")
    if body["tags"]:
        typer.echo(f"  tags: {json.dumps(body['tags'])}")
    for member in body["members"]:
        typer.echo(f"  {member['ordinal']:>5} {member['split']:<7} {member['task_id']} seed "
                   f"{member['seed']} {member['content_digest'][:12]} {member['task_status']}")
