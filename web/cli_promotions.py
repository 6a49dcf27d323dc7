"""``triloop promotions ...``: candidates on their way through the gates, and the decisions
people take on them.

Every command calls the web API with the person's token, so the CLI offers exactly what the
console offers and is refused exactly what it refuses: an auditor signs or refuses to sign
the audit, an operator approves, rejects or overrides a run's stability alarms. Governance
re-checks each decision (separation of duties, a role that predates the promotion) and a
refusal prints its reasons. A promotion is named by its id or a unique prefix of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any
from urllib.parse import urlencode

import typer

from triloop.cli_output import (
    Column,
    OutputFormat,
    OutputOption,
    echo,
    fail,
    field,
    print_json,
    print_rows,
)
from triloop.statuses import PromotionDecision, PromotionStatus
from web.cli_api import DEFAULT_API, ApiOption, TokenOption, api_call, quoted, resolve_id

promotions_app = typer.Typer(help="Candidates on their way through the gates, and the"
                                  " decisions people take on them.", no_args_is_help=True)

PromotionArgument = Annotated[str, typer.Argument(help="Promotion id or a unique prefix.")]
CommentOption = Annotated[str, typer.Option(
    "--comment", "--reason", "-m", help="Why (required; recorded with the decision).")]

PROMOTION_COLUMNS = (
    field("id", "id", is_id=True), field("candidate", "checkpoint_id", is_id=True),
    field("submitted by", "submitted_by"), field("status", "status"),
    Column("gate", lambda p: p.get("current_gate") or ""), field("created", "created_at"),
)

# How a person's recorded decision reads (``approval.kind`` / ``.decision``): the auditor's
# act is a sign-off, the word the console's button and the API route use.
DECISION_WORDS: dict[tuple[str, str], str] = {
    ("audit", "approve"): "signed the audit", ("audit", "sign"): "signed the audit",
    ("audit", "reject"): "refused to sign the audit",
    ("operator", "approve"): "approved", ("operator", "reject"): "rejected",
    ("approval", "approve"): "approved", ("approval", "reject"): "rejected",
    ("alarm_override", "override"): "overrode the stability alarms",
}

# What each command does, in the words its output uses.
DONE_WORDS: dict[PromotionDecision, str] = {
    PromotionDecision.SIGN_AUDIT: "signed the audit of",
    PromotionDecision.REJECT_AUDIT: "refused to sign the audit of",
    PromotionDecision.APPROVE: "approved", PromotionDecision.REJECT: "rejected",
    PromotionDecision.OVERRIDE_ALARMS: "overrode the stability alarms of",
}


def decision_words(kind: str, decision: str) -> str:
    """A recorded decision as a person says it (``signed the audit``, ``approved``)."""
    return DECISION_WORDS.get((kind, decision), f"{kind}: {decision}")


@promotions_app.command("list")
def promotions_list(
    status: Annotated[PromotionStatus | None, typer.Option(
        "--status", case_sensitive=False, help="Only promotions in this status.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=200)] = 50,
    output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """Promotions, newest first."""
    query = urlencode({"limit": limit, **({"status": status.value} if status else {})})
    page = api_call("GET", f"/api/promotions?{query}", token=token, api_url=api_url)
    print_rows(page["items"], PROMOTION_COLUMNS, output, json_data=page)


def resolve_promotion(ref: str, token: str | None, api_url: str) -> str:
    """The promotion id ``ref`` is or uniquely starts."""
    return resolve_id("promotions", ref, "promotion", token=token, api_url=api_url)


@promotions_app.command("show")
def promotions_show(
    promotion_ref: PromotionArgument, output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """A promotion's gates with reasons, and its human decisions."""
    promotion_id = resolve_promotion(promotion_ref, token, api_url)
    p = api_call("GET", f"/api/promotions/{quoted(promotion_id)}", token=token,
                 api_url=api_url)
    if output is OutputFormat.json:
        print_json(p)
        return
    echo(f"promotion {p['id']}: candidate {p['checkpoint_id']} {p['status']} at "
         f"{p.get('current_gate') or '-'}")
    for alarm in p.get("alarms") or []:
        echo(f"  alarm {alarm['kind']} at iteration {alarm['iteration']} of run {p['run_id']}")
    for gate in p["gates"]:
        echo(f"  {gate['gate']}: {'passed' if gate['passed'] else 'failed'}")
        for reason in gate["reasons"]:
            echo(f"    - {reason}")
    for a in p.get("approvals") or []:
        echo(f"  {a['user_name']} {decision_words(a['kind'], a['decision'])}: {a['comment']}")


def _decide(decision: PromotionDecision, promotion_ref: str, comment: str,
            output: OutputFormat, token: str | None, api_url: str) -> None:
    if not comment.strip():
        fail("a decision needs --comment saying why (it is recorded with it)", code=2)
    promotion_id = resolve_promotion(promotion_ref, token, api_url)
    route = decision.value.replace("_", "-")
    outcome = api_call("POST", f"/api/promotions/{quoted(promotion_id)}/{route}",
                       token=token, api_url=api_url, body={"comment": comment})
    if output is OutputFormat.json:
        print_json(outcome)
        return
    result: dict[str, Any] = outcome.get("result") or {}
    echo(f"{outcome['user']} {DONE_WORDS[decision]} promotion {outcome['promotion_id']}:"
         f" {result.get('gate', decision.gate)} gate {result.get('verdict') or '-'}")
    for reason in result.get("reasons") or []:
        echo(f"  - {reason}")


# Each decision's command: its name (the API route's), the decision, what it does and who.
DECISION_COMMANDS: tuple[tuple[str, PromotionDecision, str], ...] = (
    ("sign-audit", PromotionDecision.SIGN_AUDIT, "Sign the audit of a promotion waiting at the"
     " audit gate (auditors; not the run's submitter)."),
    ("reject-audit", PromotionDecision.REJECT_AUDIT, "Refuse to sign the audit, with the"
     " reason (auditors): the candidate is rejected."),
    ("approve", PromotionDecision.APPROVE, "Approve a signed candidate at the approval gate"
     " (operators; not the run's submitter, not the auditor who signed; a role granted"
     " before the promotion opened)."),
    ("reject", PromotionDecision.REJECT, "Reject the candidate at the approval gate"
     " (operators)."),
    ("override", PromotionDecision.OVERRIDE_ALARMS, "Let a candidate past its run's stability"
     " alarms, with the written reason (operators; not the run's submitter; a role granted"
     " before the promotion opened)."),
)


def _decision_command(decision: PromotionDecision) -> Callable[..., None]:
    def command(promotion_ref: PromotionArgument, comment: CommentOption,
                output: OutputOption = OutputFormat.table,
                token: TokenOption = None, api_url: ApiOption = DEFAULT_API) -> None:
        _decide(decision, promotion_ref, comment, output, token, api_url)

    return command


for _name, _decision, _help in DECISION_COMMANDS:
    promotions_app.command(_name, help=_help)(_decision_command(_decision))
# The name the README and the console used first; both work.
promotions_app.command("override-alarms", help="Same as `promotions override`.")(
    _decision_command(PromotionDecision.OVERRIDE_ALARMS))
