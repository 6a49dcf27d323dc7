"""Command groups the ``triloop`` CLI mounts: users, train, promotions, rollback, faults.

``users create`` runs on this machine with the web service's database role: it is how the
two founding admins come to exist on a fresh install (a privileged role needs one admin to
ask and another to confirm), and it refuses once two admins exist.
Everything else calls the HTTP API with a token (``--token`` or ``TRILOOP_TOKEN``) at
``TRILOOP_API_URL``, so the CLI is refused exactly what the console would refuse.
"""

from __future__ import annotations

import getpass
import json
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlencode

import httpx
import typer
from rich.console import Console
from rich.table import Table

from triloop.config import get_settings

console = Console()
err = Console(stderr=True)

users_app = typer.Typer(help="People and their API tokens (on the server machine).",
                        no_args_is_help=True)
train_app = typer.Typer(help="Submit and follow training runs (ML engineers).",
                        no_args_is_help=True)
promotions_app = typer.Typer(help="Candidates on their way through the gates.",
                             no_args_is_help=True)
faults_app = typer.Typer(
    help="Game days (operators): serve a checkpoint degraded on purpose, to check that the "
    "watch gate rolls it back. Through the API, authorized and audited.",
    no_args_is_help=True,
)

TokenOption = Annotated[
    str | None, typer.Option("--token", envvar="TRILOOP_TOKEN", help="API token.")
]
ApiOption = Annotated[
    str, typer.Option("--api-url", envvar="TRILOOP_API_URL", help="Base URL of the web API.")
]
DEFAULT_API = "http://127.0.0.1:8000"


def _local_actor() -> str:
    return f"{getpass.getuser()}@cli"


@users_app.command("create")
def users_create(
    name: Annotated[str, typer.Argument(help="Lowercase user name, e.g. root.")],
    role: Annotated[list[str], typer.Option("--role", help="admin: the founding users are"
                                                            " admins.")],
) -> None:
    """Create a founding admin (while fewer than two admins exist); prints their API token.

    Only the two founding admins are made here, on the server, with the web service's
    database role: two, because granting a privileged role takes one admin to ask and
    another to confirm. Everyone after is created by an admin through the API (`triloop
    users add` or POST /api/users), and their operator, auditor or admin role becomes
    active only when a second admin confirms it (`triloop users confirm GRANT_ID`).
    """
    from triloop.db import role_engine, session_scope
    from triloop.policy import Actor, PolicyDenied, Resource
    from triloop.wiring import build_authorizer
    from web.users import UserError, check_new_user, create_first_admin

    settings = get_settings()
    try:
        roles = check_new_user(name, role)
        if roles != ["admin"]:
            raise UserError("a founding user is an admin (--role admin) and nothing else;"
                            " an admin then creates everyone else through the API")
        actor = Actor(service="web", user=_local_actor(), roles=("admin",))
        build_authorizer(settings, "web").authorize(
            actor, "create", Resource(kind="user", id=name, attrs={"via": "cli",
                                                                  "founding_admin": True})
        )
        with session_scope(role_engine(settings, "web")) as session:
            _, token = create_first_admin(session=session, name=name,
                                          created_by=_local_actor(),
                                          token_lifetime_s=settings.api_token_lifetime_s)
    except (UserError, PolicyDenied) as error:
        err.print(f"[red]error:[/red] {error}")
        raise typer.Exit(1) from error
    console.print(f"created {name} ({', '.join(roles)}). API token (shown once, keep it safe):")
    console.print(token, markup=False, highlight=False, soft_wrap=True)


@users_app.command("add")
def users_add(
    name: Annotated[str, typer.Argument(help="Lowercase user name, e.g. alice.")],
    role: Annotated[list[str], typer.Option("--role", help="ml_engineer, operator, auditor "
                                                            "or admin; repeat for more.")],
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """An admin creates a person through the API; prints their API token (shown once)."""
    created = api_call("POST", "/api/users", token=token, api_url=api_url,
                       body={"name": name, "roles": role})
    for grant in created.get("pending_grants") or []:
        console.print(f"role {grant['role']} pending: another admin runs `triloop users confirm"
                      f" {grant['id']}`", markup=False, highlight=False, soft_wrap=True)
    console.print(f"created {created['name']} ({', '.join(created['roles'])}). API token"
                  " (shown once, keep it safe):")
    console.print(created["token"], markup=False, highlight=False, soft_wrap=True)


def _print_grant(grant: dict[str, Any]) -> None:
    decided = f"\tby {grant['confirmed_by']}" if grant.get("confirmed_by") else ""
    console.print(f"{grant['id']}\t{grant['user_name']}\t{grant['role']}\t{grant['status']}"
                  f"\trequested by {grant['requested_by']}{decided}",
                  markup=False, highlight=False, soft_wrap=True)


@users_app.command("grant")
def users_grant(
    name: Annotated[str, typer.Argument(help="Who gets the role.")],
    role: Annotated[str, typer.Option("--role", help="operator, auditor or admin.")],
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """An admin asks for a privileged role for a person; another admin confirms it."""
    grant = api_call("POST", f"/api/users/{quote(name, safe='')}/roles", token=token,
                     api_url=api_url, body={"role": role})
    _print_grant(grant)


@users_app.command("confirm")
def users_confirm(
    grant_id: Annotated[str, typer.Argument(help="Grant id (from `triloop users grants`).")],
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """A second admin confirms a pending grant: the role becomes active now."""
    _print_grant(api_call("POST", f"/api/role-grants/{quote(grant_id, safe='')}/confirm",
                          token=token, api_url=api_url))


@users_app.command("refuse-grant")
def users_refuse_grant(
    grant_id: Annotated[str, typer.Argument(help="Grant id (from `triloop users grants`).")],
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """A second admin refuses a pending grant: the role never becomes active."""
    _print_grant(api_call("POST", f"/api/role-grants/{quote(grant_id, safe='')}/refuse",
                          token=token, api_url=api_url))


@users_app.command("grants")
def users_grants(
    status: Annotated[str | None, typer.Option("--status", help="pending, active or refused."
                                               )] = "pending",
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """List role grants, newest first (pending ones by default)."""
    query = "?" + urlencode({"limit": 200, **({"status": status} if status else {})})
    page = api_call("GET", f"/api/role-grants{query}", token=token, api_url=api_url)
    for grant in page["items"]:
        _print_grant(grant)


def _authorize_locally(action: str, resource: Any) -> None:
    """Ask the policy as the local operator acting as an admin (audited); exit 1 if refused."""
    from triloop.policy import Actor, PolicyDenied
    from triloop.wiring import build_authorizer

    actor = Actor(service="web", user=_local_actor(), roles=("admin",))
    try:
        build_authorizer(get_settings(), "web").authorize(actor, action, resource)
    except PolicyDenied as error:
        err.print(f"[red]error:[/red] {error}")
        raise typer.Exit(1) from error


@users_app.command("token")
def users_token(
    name: Annotated[str, typer.Argument(help="The person who gets the token.")],
    label: Annotated[str, typer.Option("--label", help="What the token is for.")] = "",
) -> None:
    """Issue a new API token for a person (e.g. after theirs expired); printed once."""
    from triloop.db import role_engine, session_scope
    from triloop.policy import Resource
    from web.tokens import issue_token
    from web.users import get_user

    settings = get_settings()
    _authorize_locally("create", Resource(kind="api_token", owner=name, attrs={"via": "cli"}))
    with session_scope(role_engine(settings, "web")) as session:
        if get_user(session=session, name=name) is None:
            err.print(f"[red]error:[/red] no enabled user {name!r}")
            raise typer.Exit(1)
        row, token = issue_token(session=session, user_name=name, created_by=_local_actor(),
                                 lifetime_s=settings.api_token_lifetime_s, label=label)
    expires = row.expires_at.isoformat(timespec="seconds")
    console.print(f"token {row.id} for {name}, expires {expires} (shown once, keep it safe):",
                  markup=False, highlight=False)
    console.print(token, markup=False, highlight=False, soft_wrap=True)


@users_app.command("tokens")
def users_tokens(
    name: Annotated[str, typer.Argument(help="Whose tokens to list.")],
) -> None:
    """List a person's API tokens: id, state, expiry (never the token or its hash)."""
    from triloop.db import role_engine, session_scope
    from triloop.policy import Resource
    from web.pagination import MAX_LIMIT
    from web.tokens import list_tokens

    _authorize_locally("read", Resource(kind="api_token", owner=name, attrs={"via": "cli"}))
    with session_scope(role_engine(get_settings(), "web")) as session:
        page = list_tokens(session=session, limit=MAX_LIMIT, cursor=None, user_name=name)
    for t in page.items:
        revoked = f" by {t.revoked_by}" if t.revoked_by else ""
        expires = t.expires_at.isoformat(timespec="seconds")
        console.print(f"{t.id}\t{t.state}{revoked}\texpires {expires}\t{t.label}",
                      markup=False, highlight=False, soft_wrap=True)


@users_app.command("revoke-token")
def users_revoke_token(
    token_id: Annotated[str, typer.Argument(help="Token id (from `triloop users tokens`).")],
) -> None:
    """Revoke an API token at once; it never authenticates again."""
    from triloop.db import role_engine, session_scope
    from triloop.policy import Resource
    from web.tokens import TokenError, get_token, revoke_token

    engine = role_engine(get_settings(), "web")
    with session_scope(engine) as session:
        row = get_token(session=session, token_id=token_id)
    if row is None:
        err.print(f"[red]error:[/red] no API token with id {token_id!r}")
        raise typer.Exit(1)
    _authorize_locally("revoke", Resource(kind="api_token", id=token_id, owner=row.user_name,
                                          attrs={"via": "cli"}))
    try:
        with session_scope(engine) as session:
            revoked = revoke_token(session=session, token_id=token_id, revoked_by=_local_actor())
    except TokenError as error:
        err.print(f"[red]error:[/red] {error}")
        raise typer.Exit(1) from error
    console.print(f"revoked token {revoked.id} of {revoked.user}", markup=False, highlight=False)


@users_app.command("list")
def users_list() -> None:
    """List users and their roles (never tokens)."""
    from sqlmodel import Session, col, select

    from triloop.db import role_engine
    from triloop.models import User
    from triloop.policy import Actor, PolicyDenied, Resource
    from triloop.wiring import build_authorizer

    settings = get_settings()
    try:
        build_authorizer(settings, "web").authorize(
            Actor(service="web", user=_local_actor(), roles=("admin",)), "read",
            Resource(kind="user", attrs={"via": "cli"}),
        )
    except PolicyDenied as error:
        err.print(f"[red]error:[/red] {error}")
        raise typer.Exit(1) from error
    with Session(role_engine(settings, "web")) as session:
        rows = list(session.exec(select(User).order_by(col(User.created_at))))
    for user in rows:
        state = " (disabled)" if user.disabled else ""
        console.print(f"{user.name}\t{','.join(user.roles)}{state}\tcreated by {user.created_by} "
                      f"at {user.created_at.isoformat(timespec='seconds')}",
                      markup=False, highlight=False, soft_wrap=True)


def api_call(
    method: str, path: str, *, token: str | None, api_url: str, body: Any = None
) -> Any:
    """Call the API; print the problem and exit 1 on any error."""
    if not token:
        err.print("[red]error:[/red] no API token: pass --token or set TRILOOP_TOKEN")
        raise typer.Exit(2)
    try:
        response = httpx.request(
            method, api_url.rstrip("/") + path, json=body, timeout=120,
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
        )
    except httpx.HTTPError as error:
        err.print(f"[red]error:[/red] cannot reach the API at {api_url}: {error}")
        raise typer.Exit(1) from error
    if response.status_code >= 400:
        _print_problem(response)
        raise typer.Exit(1)
    return response.json()


def _print_problem(response: httpx.Response) -> None:
    try:
        problem = response.json()
    except ValueError:
        err.print(f"[red]error {response.status_code}:[/red] {response.text[:500]}")
        return
    err.print(f"[red]error {response.status_code} {problem.get('title', '')}:[/red] "
              f"{problem.get('detail', '')}", markup=True, highlight=False)
    for reason in problem.get("reasons") or []:
        err.print(f"  - {reason}", markup=False, highlight=False)


@train_app.command("submit")
def train_submit(
    run_file: Annotated[Path, typer.Argument(help="RUN.yaml", exists=True, dir_okay=False)],
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """Submit RUN.yaml; prints the run id to follow with `triloop train status`."""
    run = api_call("POST", "/api/runs", token=token, api_url=api_url,
                   body={"config_yaml": run_file.read_text()})
    console.print(f"submitted run [bold]{run['id']}[/bold] ({run['name']}), "
                  f"workflow {run['workflow_id']}")
    console.print(f"console: {api_url.rstrip('/')}/runs/{run['id']}")


@train_app.command("status")
def train_status(
    run_id: str, token: TokenOption = None, api_url: ApiOption = DEFAULT_API
) -> None:
    """A run's status, latest metrics and alarms."""
    run = api_call("GET", f"/api/runs/{run_id}", token=token, api_url=api_url)
    console.print(f"run {run['id']} ({run['name']}) by {run['submitted_by']}: "
                  f"[bold]{run['status']}[/bold], {run['iterations_done']} iterations")
    if run.get("status_reason"):
        console.print(f"  reason: {run['status_reason']}")
    if run["metrics"]:
        last = run["metrics"][-1]
        keys = ("reward_mean", "entropy", "kl", "grad_norm", "discrimination")
        values = ", ".join(f"{k}={last[k]:.4g}" for k in keys if last.get(k) is not None)
        console.print(f"  iteration {last['iteration']}: {values}")
    for alarm in run["alarms"]:
        console.print(f"  [red]alarm[/red] {alarm['name']} at iteration {alarm['iteration']}")
    if run["status"] == "paused":
        console.print(f"  paused: `triloop train resume {run['id']}` goes on, "
                      f"`triloop train cancel {run['id']}` stops it")
    elif run["status"] == "completed_with_alarms":
        console.print("  [yellow]completed with stability alarms[/yellow]: a candidate proposed"
                      " within the threshold's alarm window waits at the stability gate for an"
                      " operator's `triloop promotions override-alarms` (or is rejected)")


def _control_run(action: str, run_id: str, reason: str | None, token: str | None,
                 api_url: str) -> None:
    run = api_call("POST", f"/api/runs/{run_id}/{action}", token=token, api_url=api_url,
                   body={"reason": reason} if reason else {})
    console.print(f"asked to {action} run {run['id']} ({run['name']}); it is"
                  f" [bold]{run['status']}[/bold]. The learning loop checks the request with"
                  " the policy and applies it between steps: see `triloop train status`.")


ReasonOption = Annotated[str | None, typer.Option("--reason", help="Why, for the record.")]


@train_app.command("pause")
def train_pause(run_id: str, reason: ReasonOption = None, token: TokenOption = None,
                api_url: ApiOption = DEFAULT_API) -> None:
    """Pause one of your runs after its current iteration."""
    _control_run("pause", run_id, reason, token, api_url)


@train_app.command("resume")
def train_resume(run_id: str, reason: ReasonOption = None, token: TokenOption = None,
                 api_url: ApiOption = DEFAULT_API) -> None:
    """Resume one of your paused runs, e.g. one an alarm paused (stability.pause_on_alarm)."""
    _control_run("resume", run_id, reason, token, api_url)


@train_app.command("cancel")
def train_cancel(run_id: str, reason: ReasonOption = None, token: TokenOption = None,
                 api_url: ApiOption = DEFAULT_API) -> None:
    """Cancel one of your runs; checkpoints already written stay in its lineage."""
    _control_run("cancel", run_id, reason, token, api_url)


@promotions_app.command("list")
def promotions_list(
    status: Annotated[str | None, typer.Option(help="open, promoted, rejected, ...")] = None,
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """Promotions, newest first."""
    query = f"?status={status}" if status else ""
    page = api_call("GET", f"/api/promotions{query}", token=token, api_url=api_url)
    table = Table("id", "candidate", "submitted by", "status", "gate")
    for p in page["items"]:
        table.add_row(p["id"], p["checkpoint_id"][:16], p["submitted_by"], p["status"],
                      p.get("current_gate") or "")
    console.print(table)


@promotions_app.command("show")
def promotions_show(
    promotion_id: str, token: TokenOption = None, api_url: ApiOption = DEFAULT_API
) -> None:
    """A promotion's gates with reasons, and its human decisions."""
    p = api_call("GET", f"/api/promotions/{promotion_id}", token=token, api_url=api_url)
    console.print(f"promotion {p['id']}: candidate {p['checkpoint_id']} "
                  f"[bold]{p['status']}[/bold] at {p.get('current_gate') or '-'}")
    for alarm in p.get("alarms") or []:
        console.print(f"  [red]alarm[/red] {alarm['kind']} at iteration {alarm['iteration']}"
                      f" of run {p['run_id']}")
    for gate in p["gates"]:
        mark = "[green]passed[/green]" if gate["passed"] else "[red]failed[/red]"
        console.print(f"  {gate['gate']}: {mark}")
        for reason in gate["reasons"]:
            console.print(f"    - {reason}", markup=False, highlight=False)
    for a in p.get("approvals") or []:
        console.print(f"  {a['kind']} by {a['user_name']}: {a['decision']} ({a['comment']})",
                      markup=False, highlight=False)


@promotions_app.command("override-alarms")
def promotions_override_alarms(
    promotion_id: str,
    reason: Annotated[str, typer.Option(
        "--reason", help="Why the alarms do not disqualify the candidate (recorded).")],
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """Let a candidate past its run's stability alarms (operators; not the run's submitter)."""
    result = api_call("POST", f"/api/promotions/{quote(promotion_id)}/override-alarms",
                      token=token, api_url=api_url, body={"comment": reason})
    console.print(json.dumps(result, indent=2), markup=False, highlight=False)


def rollback_command(
    reason: Annotated[str | None, typer.Option(
        "--reason", help="Why (recorded in the audit log); not needed with --dry-run.")] = None,
    alias: Annotated[str, typer.Option("--alias", help="Deployment alias.")] = "production",
    to_revision: Annotated[int | None, typer.Option(
        "--to-revision", min=1, help="Return to this revision of the alias's history.")] = None,
    to_checkpoint: Annotated[str | None, typer.Option(
        "--to-checkpoint", help="Return to this checkpoint's latest revision.")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Show where the rollback would go; change nothing.")] = False,
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """Roll an alias back to the last revision that was not rolled back (operators).

    A rolled-back checkpoint is never served again without a new promotion.
    """
    if to_revision is not None and to_checkpoint:
        err.print("[red]error:[/red] pass --to-revision or --to-checkpoint, not both")
        raise typer.Exit(2)
    if dry_run:
        query = urlencode({k: v for k, v in (("to_revision", to_revision),
                                             ("to_checkpoint_id", to_checkpoint)) if v})
        preview = api_call("GET", f"/api/deployments/{quote(alias)}/rollback-preview"
                           + (f"?{query}" if query else ""), token=token, api_url=api_url)
        _print_preview(preview)
        return
    if not reason or not reason.strip():
        err.print("[red]error:[/red] a rollback needs --reason (or use --dry-run)")
        raise typer.Exit(2)
    body: dict[str, Any] = {"alias": alias, "reason": reason}
    if to_revision is not None:
        body["to_revision"] = to_revision
    if to_checkpoint:
        body["to_checkpoint_id"] = to_checkpoint
    result = api_call("POST", "/api/rollback", token=token, api_url=api_url, body=body)
    console.print(json.dumps(result, indent=2), markup=False, highlight=False)


def _print_preview(preview: dict[str, Any]) -> None:
    target = preview["target"]
    console.print(f"dry run: nothing changed. {preview['alias']} serves "
                  f"{preview['current_checkpoint_id']}", markup=False, highlight=False)
    console.print(f"a rollback would return to revision {target['revision']}: checkpoint "
                  f"{target['checkpoint_id']}, moved there by {target['actor']} "
                  f"({target['kind']}: {target['reason']}) at {target['created_at']}",
                  markup=False, highlight=False, soft_wrap=True)
    table = Table("revision", "checkpoint", "kind", "by", "reason", "state")
    for r in preview["history"]:
        state = ("serving" if r["serving"] else
                 f"rolled back at {r['rolled_back_at']}" if r["rolled_back_at"] else
                 "target" if r["revision"] == target["revision"] else "")
        table.add_row(str(r["revision"]), r["checkpoint_id"][:16], r["kind"], r["actor"],
                      r["reason"][:40], state)
    console.print(table)


@faults_app.command("inject")
def faults_inject(
    checkpoint_id: Annotated[str, typer.Argument(help="Checkpoint to serve degraded.")],
    temperature: Annotated[
        float, typer.Option(help="Sampling temperature its production episodes get.")
    ] = 4.0,
    note: Annotated[str, typer.Option(help="Why: recorded on every episode it touches.")] = (
        "game day"
    ),
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """Degrade one checkpoint's production and canary episodes (operators; audited)."""
    fault = api_call("POST", "/api/faults", token=token, api_url=api_url,
                     body={"checkpoint_id": checkpoint_id, "temperature": temperature,
                           "note": note})
    console.print(f"serving {fault['checkpoint_id']} at temperature {fault['temperature']} "
                  "until `triloop faults clear`; its episodes never count toward a pass",
                  markup=False, highlight=False, soft_wrap=True)


@faults_app.command("clear")
def faults_clear(token: TokenOption = None, api_url: ApiOption = DEFAULT_API) -> None:
    """Remove every injected serving fault (operators; audited)."""
    result = api_call("DELETE", "/api/faults", token=token, api_url=api_url)
    console.print(f"cleared {result['cleared']} serving fault(s)")


@faults_app.command("list")
def faults_list(token: TokenOption = None, api_url: ApiOption = DEFAULT_API) -> None:
    """The serving faults in force."""
    for fault in api_call("GET", "/api/faults", token=token, api_url=api_url):
        console.print(f"{fault['checkpoint_id']}\ttemperature {fault['temperature']}\t"
                      f"{fault['note']}", markup=False, highlight=False, soft_wrap=True)
