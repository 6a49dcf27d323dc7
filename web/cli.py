"""Command groups the ``triloop`` CLI mounts: users and faults (``train`` lives in
``web.cli_runs``, ``promotions`` in ``web.cli_promotions``, ``deployments`` and ``rollback``
in ``web.cli_deployments``, ``checkpoints`` in ``web.cli_checkpoints``; the HTTP helper and
the id-prefix resolver every command uses in ``web.cli_api``).

``users create``, ``token``, ``tokens``, ``revoke-token`` and ``list`` run on the server with
the database owner's credentials (the operator's secrets folder): ``users create`` is how
the two founding admins come to exist on a fresh install (a privileged role needs one admin
to ask and another to confirm), and it refuses once two admins exist. The web service's
own role cannot do these: it never writes a privileged role, and it issues a token only
for the person whose credential the database checked (migration 0020).
Everything else calls the HTTP API with a token (``--token`` or ``TRILOOP_TOKEN``) at
``TRILOOP_API_URL``, so the CLI is refused exactly what the console would refuse.
"""

from __future__ import annotations

import getpass
from typing import Annotated, Any
from urllib.parse import urlencode

import typer

from triloop.cli_output import OutputFormat, OutputOption, fail, field, out, print_rows
from triloop.config import get_settings
from triloop.statuses import GrantStatus
from web.cli_api import DEFAULT_API, ApiOption, TokenOption, api_call, quoted, resolve_id
from web.cli_checkpoints import resolve_checkpoint
from web.cli_deployments import rollback_command
from web.cli_promotions import promotions_app
from web.cli_runs import train_app

# Tests and older scripts mount the groups from here.
__all__ = ["api_call", "promotions_app", "rollback_command", "train_app"]

# Never wraps when piped (see triloop.cli_output).
console = out()

users_app = typer.Typer(help="People and their API tokens (on the server machine).",
                        no_args_is_help=True)
faults_app = typer.Typer(
    help="Game days (operators): serve a checkpoint degraded on purpose, to check that the "
    "watch gate rolls it back. Through the API, authorized and audited.",
    no_args_is_help=True,
)



def _local_actor() -> str:
    return f"{getpass.getuser()}@cli"


def _server_engine() -> Any:
    """The owner's engine: these commands run on the server, as the database's owner."""
    from triloop.db import owner_engine

    return owner_engine(get_settings())


def _server_authorizer() -> Any:
    """The web service's policy, audited with the owner's role (the local actor is no
    person the database could check a credential of)."""
    from triloop.wiring import build_authorizer

    return build_authorizer(get_settings(), "web", audit_engine=_server_engine())


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
    from triloop.db import session_scope
    from triloop.policy import Actor, PolicyDenied, Resource
    from web.users import UserError, check_new_user, create_first_admin

    settings = get_settings()
    try:
        roles = check_new_user(name, role)
        if roles != ["admin"]:
            raise UserError("a founding user is an admin (--role admin) and nothing else;"
                            " an admin then creates everyone else through the API")
        actor = Actor(service="web", user=_local_actor(), roles=("admin",))
        _server_authorizer().authorize(
            actor, "create", Resource(kind="user", id=name, attrs={"via": "cli",
                                                                  "founding_admin": True})
        )
        with session_scope(_server_engine()) as session:
            _, token = create_first_admin(session=session, name=name,
                                          created_by=_local_actor(),
                                          token_lifetime_s=settings.api_token_lifetime_s)
    except (UserError, PolicyDenied) as error:
        fail(str(error))
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
    grant = api_call("POST", f"/api/users/{quoted(name)}/roles", token=token,
                     api_url=api_url, body={"role": role})
    _print_grant(grant)


GrantArgument = Annotated[str, typer.Argument(
    help="Grant id (from `triloop users grants`), or a unique prefix of it.")]


def _resolve_grant(ref: str, token: str | None, api_url: str) -> str:
    return resolve_id("role-grants", ref, "role grant", token=token, api_url=api_url)


@users_app.command("confirm")
def users_confirm(
    grant_id: GrantArgument, token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """A second admin confirms a pending grant: the role becomes active now."""
    grant_id = _resolve_grant(grant_id, token, api_url)
    _print_grant(api_call("POST", f"/api/role-grants/{quoted(grant_id)}/confirm",
                          token=token, api_url=api_url))


@users_app.command("refuse-grant")
def users_refuse_grant(
    grant_id: GrantArgument, token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """A second admin refuses a pending grant: the role never becomes active."""
    grant_id = _resolve_grant(grant_id, token, api_url)
    _print_grant(api_call("POST", f"/api/role-grants/{quoted(grant_id)}/refuse",
                          token=token, api_url=api_url))


@users_app.command("grants")
def users_grants(
    status: Annotated[GrantStatus | None, typer.Option(
        "--status", case_sensitive=False, help="Only grants in this status.")
    ] = GrantStatus.pending,
    output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """List role grants, newest first (pending ones by default)."""
    query = "?" + urlencode({"limit": 200, **({"status": status.value} if status else {})})
    page = api_call("GET", f"/api/role-grants{query}", token=token, api_url=api_url)
    print_rows(page["items"], GRANT_COLUMNS, output, json_data=page)


GRANT_COLUMNS = (field("id", "id"), field("user", "user_name"), field("role", "role"),
                 field("status", "status"), field("requested by", "requested_by"),
                 field("confirmed by", "confirmed_by"))


def _authorize_locally(action: str, resource: Any) -> None:
    """Ask the policy as the local operator acting as an admin (audited); exit 1 if refused."""
    from triloop.policy import Actor, PolicyDenied

    actor = Actor(service="web", user=_local_actor(), roles=("admin",))
    try:
        _server_authorizer().authorize(actor, action, resource)
    except PolicyDenied as error:
        fail(str(error))


@users_app.command("token")
def users_token(
    name: Annotated[str, typer.Argument(help="The person who gets the token.")],
    label: Annotated[str, typer.Option("--label", help="What the token is for.")] = "",
) -> None:
    """Issue a new API token for a person (e.g. after theirs expired); printed once."""
    from triloop.db import session_scope
    from triloop.policy import Resource
    from web.tokens import issue_token
    from web.users import get_user

    settings = get_settings()
    _authorize_locally("create", Resource(kind="api_token", owner=name, attrs={"via": "cli"}))
    with session_scope(_server_engine()) as session:
        if get_user(session=session, name=name) is None:
            fail(f"no enabled user {name!r}")
        row, token = issue_token(session=session, user_name=name, created_by=_local_actor(),
                                 lifetime_s=settings.api_token_lifetime_s, label=label)
    expires = row.expires_at.isoformat(timespec="seconds")
    console.print(f"token {row.id} for {name}, expires {expires} (shown once, keep it safe):",
                  markup=False, highlight=False)
    console.print(token, markup=False, highlight=False, soft_wrap=True)


@users_app.command("tokens")
def users_tokens(
    name: Annotated[str, typer.Argument(help="Whose tokens to list.")],
    output: OutputOption = OutputFormat.table,
) -> None:
    """List a person's API tokens: id, state, expiry (never the token or its hash)."""
    from triloop.db import session_scope
    from triloop.policy import Resource
    from web.pagination import MAX_LIMIT
    from web.tokens import list_tokens

    _authorize_locally("read", Resource(kind="api_token", owner=name, attrs={"via": "cli"}))
    with session_scope(_server_engine()) as session:
        page = list_tokens(session=session, limit=MAX_LIMIT, cursor=None, user_name=name)
    rows = [t.model_dump(mode="json") for t in page.items]
    print_rows(rows, (field("id", "id"), field("state", "state"),
                      field("revoked by", "revoked_by"), field("expires", "expires_at"),
                      field("label", "label")), output)


@users_app.command("revoke-token")
def users_revoke_token(
    token_id: Annotated[str, typer.Argument(help="Token id (from `triloop users tokens`).")],
) -> None:
    """Revoke an API token at once; it never authenticates again."""
    from triloop.db import session_scope
    from triloop.policy import Resource
    from web.tokens import TokenError, get_token, revoke_token

    engine = _server_engine()
    with session_scope(engine) as session:
        row = get_token(session=session, token_id=token_id)
    if row is None:
        fail(f"no API token with id {token_id!r}")
    _authorize_locally("revoke", Resource(kind="api_token", id=token_id, owner=row.user_name,
                                          attrs={"via": "cli"}))
    try:
        with session_scope(engine) as session:
            revoked = revoke_token(session=session, token_id=token_id, revoked_by=_local_actor())
    except TokenError as error:
        fail(str(error))
    console.print(f"revoked token {revoked.id} of {revoked.user}", markup=False, highlight=False)


@users_app.command("list")
def users_list(output: OutputOption = OutputFormat.table) -> None:
    """List users and their roles (never tokens)."""
    from sqlmodel import Session, col, select

    from triloop.models import User
    from triloop.policy import Actor, PolicyDenied, Resource

    try:
        _server_authorizer().authorize(
            Actor(service="web", user=_local_actor(), roles=("admin",)), "read",
            Resource(kind="user", attrs={"via": "cli"}),
        )
    except PolicyDenied as error:
        fail(str(error))
    with Session(_server_engine()) as session:
        rows = [{"name": u.name, "roles": ",".join(u.roles), "disabled": u.disabled,
                 "created_by": u.created_by, "created_at": u.created_at.isoformat()}
                for u in session.exec(select(User).order_by(col(User.created_at)))]
    print_rows(rows, (field("name", "name"), field("roles", "roles"),
                      field("disabled", "disabled"), field("created by", "created_by"),
                      field("created", "created_at")), output)


@faults_app.command("inject")
def faults_inject(
    checkpoint_ref: Annotated[str, typer.Argument(
        help="Checkpoint to serve degraded: its id, a unique prefix of it, or its name.")],
    temperature: Annotated[
        float, typer.Option(help="Sampling temperature its production episodes get.")
    ] = 4.0,
    note: Annotated[str, typer.Option(help="Why: recorded on every episode it touches.")] = (
        "game day"
    ),
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """Degrade one checkpoint's production and canary episodes (operators; audited)."""
    checkpoint_id = resolve_checkpoint(checkpoint_ref, token=token, api_url=api_url)
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
def faults_list(output: OutputOption = OutputFormat.table, token: TokenOption = None,
                api_url: ApiOption = DEFAULT_API) -> None:
    """The serving faults in force."""
    faults = api_call("GET", "/api/faults", token=token, api_url=api_url)
    print_rows(faults, (field("checkpoint", "checkpoint_id", is_id=True),
                        field("temperature", "temperature"), field("by", "injected_by"),
                        field("since", "injected_at"), field("note", "note")), output)
