"""``triloop trajectories list|show``: episodes' transcripts, through the API with the
person's token (so the policy refuses here exactly what the console refuses)."""

from __future__ import annotations

import sys
from typing import Annotated, Any
from urllib.parse import urlencode

import typer

from triloop.cli_output import (
    Column,
    OutputFormat,
    OutputOption,
    echo,
    field,
    print_json,
    print_rows,
)
from triloop.statuses import EpisodeStatus, Purpose
from web.cli_api import DEFAULT_API, ApiOption, TokenOption, api_call, quoted, resolve_id
from web.cli_checkpoints import resolve_checkpoint

trajectories_app = typer.Typer(
    help="Episodes' transcripts: turns, tokens, rewards and the verifier's verdict.",
    no_args_is_help=True)

LIST_COLUMNS = (
    field("id", "id", is_id=True), field("purpose", "purpose"), field("task", "task_id"),
    field("checkpoint", "checkpoint_id", is_id=True), field("status", "status"),
    Column("success", lambda e: e["verdict_success"] if e["verdict_success"] is not None
           else e["success"]),
    field("reward", "total_reward"), field("steps", "num_steps"),
)


@trajectories_app.command("list")
def trajectories_list(
    run_id: Annotated[str | None, typer.Option("--run", help="A run's training episodes.")] = None,
    iteration: Annotated[int | None, typer.Option("--iteration", min=0,
                                                  help="With --run: one iteration's.")] = None,
    promotion_id: Annotated[str | None, typer.Option(
        "--promotion", help="A promotion's eval, shadow and canary episodes.")] = None,
    checkpoint_id: Annotated[str | None, typer.Option("--checkpoint")] = None,
    purpose: Annotated[Purpose | None, typer.Option("--purpose", case_sensitive=False)] = None,
    batch_id: Annotated[str | None, typer.Option("--batch")] = None,
    task_id: Annotated[str | None, typer.Option("--task")] = None,
    status: Annotated[EpisodeStatus | None, typer.Option("--status",
                                                         case_sensitive=False)] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=200)] = 50,
    cursor: Annotated[str | None, typer.Option("--cursor", help="next_cursor of a page.")] = None,
    output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """Episodes, newest first; the next page's command goes to stderr. A run, promotion,
    checkpoint or task is named by its id or a unique prefix of it."""
    def full(collection: str, ref: str | None, noun: str) -> str | None:
        return None if ref is None else resolve_id(collection, ref, noun, token=token,
                                                   api_url=api_url)

    run_id = full("runs", run_id, "training run")
    promotion_id = full("promotions", promotion_id, "promotion")
    task_id = full("tasks", task_id, "task")
    if checkpoint_id is not None:
        checkpoint_id = resolve_checkpoint(checkpoint_id, token=token, api_url=api_url)
    pairs = (("run_id", run_id), ("iteration", iteration), ("promotion_id", promotion_id),
             ("checkpoint_id", checkpoint_id), ("purpose", purpose and purpose.value),
             ("batch_id", batch_id), ("task_id", task_id), ("status", status and status.value),
             ("cursor", cursor))
    query = {"limit": limit, **{k: v for k, v in pairs if v is not None}}
    page = api_call("GET", f"/api/trajectories?{urlencode(query)}", token=token,
                    api_url=api_url)
    print_rows(page["items"], LIST_COLUMNS, output, json_data=page)
    if page.get("next_cursor") and output is not OutputFormat.json:
        args = " ".join(sys.argv[1:]) if sys.argv[1:] else "trajectories list"
        sys.stderr.write(f"more: triloop {args} --cursor {page['next_cursor']}\n")


def _turn_lines(turn: dict[str, Any]) -> list[str]:
    lines = [f"turn {turn['index']}  reward {turn['reward']:g}"
             + ("  (done)" if turn["done"] else ""),
             f"  observation: {turn['observation']}", f"  action: {turn['action_text']}"]
    if turn["feedback"]:
        lines.append(f"  feedback: {turn['feedback']}")
    tokens = turn.get("tokens")
    if tokens:
        trained = sum(tokens["trained"])
        logprobs = [lp for lp in tokens["behaviour_logprobs"] if lp is not None]
        mean = f", mean behaviour logprob {sum(logprobs) / len(logprobs):.3f}" if logprobs else ""
        lines.append(f"  tokens: {len(tokens['token_ids'])} ({trained} trained{mean})")
    return lines


@trajectories_app.command("show")
def trajectories_show(
    trajectory_ref: Annotated[str, typer.Argument(
        help="Episode id or a unique prefix (at least 8 characters).")],
    limit: Annotated[int, typer.Option("--turns", min=1, max=200,
                                       help="Turns per page.")] = 20,
    cursor: Annotated[str | None, typer.Option("--cursor", help="next_cursor of turns.")] = None,
    output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """An episode: what ran, how it ended, the verdict and sandbox, then its turns."""
    header = api_call("GET", f"/api/trajectories/{quoted(trajectory_ref)}", token=token,
                      api_url=api_url)
    query = urlencode({"limit": limit, **({"cursor": cursor} if cursor else {})})
    turns = api_call("GET", f"/api/trajectories/{quoted(header['id'])}/turns?{query}",
                     token=token, api_url=api_url)
    if output is OutputFormat.json:
        print_json({"trajectory": header, "turns": turns})
        return
    verdict = header.get("verdict")
    echo(f"episode {header['id']}: {header['purpose']} on task {header['task_id']} by "
         f"checkpoint {header['checkpoint_id']}")
    echo(f"  {header['status']}, success {header['success']}, reward "
         f"{header['total_reward']:g}, {header['num_steps']} steps"
         + (f" ({header['failure_reason']})" if header.get("failure_reason") else ""))
    echo("  verdict: " + ("not judged" if not verdict else
                          f"success {verdict['success']}, reward {verdict['total_reward']:g}, "
                          f"{'agrees' if verdict['agrees'] else 'DISAGREES'} with execution"))
    if header.get("sandbox"):
        echo(f"  sandbox: {header['sandbox']}")
    for turn in turns["items"]:
        for line in _turn_lines(turn):
            echo(line)
    if turns.get("next_cursor"):
        sys.stderr.write(f"more turns: triloop trajectories show {header['id']} "
                         f"--cursor {turns['next_cursor']}\n")
