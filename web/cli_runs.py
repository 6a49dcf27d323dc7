"""``triloop train ...``: submit, list, show, compare, follow and control training runs.

Every command calls the web API with the engineer's token, so the CLI is refused exactly
what the console would refuse. A run may be named by a unique prefix of its id.

``--wait`` follows the run with one progress line per change on stderr ("iteration n of N",
elapsed, the time left, and a warning when its rollouts are starved); at the end it names
the candidates the run proposed and their promotions. It exits with:

- 0: the run completed (with or without alarms), or reached the state that was asked;
- 1: the run failed or was cancelled (or the API refused the request);
- 3: the run is paused (by an alarm or a person) and waits for `train resume`;
- 4: ``--timeout`` passed first.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from triloop.cli_output import (
    Column,
    OutputFormat,
    OutputOption,
    echo,
    field,
    print_json,
    print_rows,
    progress,
)
from triloop.statuses import FINISHED_RUN_STATUSES, RunStatus
from web.cli_api import DEFAULT_API, ApiOption, TokenOption, api_call, quoted, resolve_id
from web.cli_run_compare import train_compare
from web.cli_run_progress import (
    number_text,
    progress_line,
    proposed_lines,
    share_text,
    starved_line,
)

train_app = typer.Typer(help="Submit, follow and control training runs (ML engineers).",
                        no_args_is_help=True)

EXIT_FAILED, EXIT_PAUSED, EXIT_TIMEOUT = 1, 3, 4
METRIC_KEYS = ("reward_mean", "entropy", "kl", "grad_norm", "discrimination")
SUCCESS_KEY = "success/rate"  # learning_loop.batch_metrics.SUCCESS_RATE (web imports no loop)

RunArgument = Annotated[str, typer.Argument(help="Run id, or a unique prefix of it.")]
ReasonOption = Annotated[str | None, typer.Option("--reason", help="Why, for the record.")]
WaitOption = Annotated[bool, typer.Option(
    "--wait", help="Follow the run until it ends (progress on stderr); see the exit codes.")]
TimeoutOption = Annotated[float, typer.Option(
    "--timeout", min=0, help="With --wait: give up after this many seconds (exit 4); 0: never.")]
PollOption = Annotated[float, typer.Option(
    "--poll-interval", min=0.05, help="With --wait: seconds between checks.")]


def _resolve(ref: str, token: str | None, api_url: str) -> str:
    return resolve_id("runs", ref, "training run", token=token, api_url=api_url)


def _metrics_line(point: dict[str, Any]) -> str:
    shown = {k: point[k] for k in METRIC_KEYS if point.get(k) is not None}
    success = (point.get("extra_metrics") or {}).get(SUCCESS_KEY)
    if success is not None:  # task success beside reward: shaped reward can rise without it
        shown = {"reward_mean": shown.pop("reward_mean", None), "success": success, **shown}
    values = ", ".join(f"{k}={v:.4g}" for k, v in shown.items() if v is not None)
    alarms = f"  ALARM {', '.join(point['alarms'])}" if point.get("alarms") else ""
    return f"iteration {point['iteration']}: {values}{alarms}"


def wait_for_run(run_id: str, *, token: str | None, api_url: str, timeout_s: float,
                 poll_s: float, done: Callable[[str], bool] | None = None) -> dict[str, Any]:
    """Follow a run, printing each new status and iteration on stderr; exit as documented."""
    after, last_status, last_starved = -1, "", ""
    deadline = time.monotonic() + timeout_s if timeout_s > 0 else None
    while True:
        metrics: dict[str, Any] = api_call(
            "GET", f"/api/runs/{quoted(run_id)}/metrics?after={after}", token=token,
            api_url=api_url)
        new = sorted(metrics["metrics"], key=lambda p: p["iteration"])
        for point in new:
            progress(f"run {run_id}: {_metrics_line(point)}")
            after = max(after, point["iteration"])
        status = metrics["status"]
        if status != last_status or new:
            progress(progress_line(run_id, metrics))
            last_status = status
        starved = starved_line(run_id, metrics)
        if starved != last_starved:  # once when it starts starving, not every poll
            if starved:
                progress(starved)
            last_starved = starved
        if done is not None and done(status):
            return metrics
        if status in FINISHED_RUN_STATUSES or (done is None and status == RunStatus.paused):
            if status in FINISHED_RUN_STATUSES:
                for line in proposed_lines(metrics.get("proposed") or [], api_url):
                    progress(f"run {run_id}: {line}")
            _exit_for(run_id, status, token=token, api_url=api_url)  # exits unless completed
            return metrics
        if deadline is not None and time.monotonic() >= deadline:
            progress(f"run {run_id}: still {status} after {timeout_s:g} s; stopped waiting")
            raise typer.Exit(EXIT_TIMEOUT)
        time.sleep(poll_s)


def _exit_for(run_id: str, status: str, *, token: str | None, api_url: str) -> None:
    if status in (RunStatus.completed, RunStatus.completed_with_alarms):
        return
    run = api_call("GET", f"/api/runs/{quoted(run_id)}", token=token, api_url=api_url)
    why = f": {run['status_reason']}" if run.get("status_reason") else ""
    if status == RunStatus.paused:
        progress(f"run {run_id} is paused{why}. `triloop train resume {run_id}` goes on.")
        raise typer.Exit(EXIT_PAUSED)
    progress(f"run {run_id} {status}{why}")
    raise typer.Exit(EXIT_FAILED)


@train_app.command("submit")
def train_submit(
    run_file: Annotated[Path, typer.Argument(help="RUN.yaml", exists=True, dir_okay=False)],
    wait: WaitOption = False, timeout: TimeoutOption = 0, poll_interval: PollOption = 2.0,
    output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """Submit RUN.yaml; prints the run id (follow it with `triloop train show ID --wait`)."""
    run = api_call("POST", "/api/runs", token=token, api_url=api_url,
                   body={"config_yaml": run_file.read_text()})
    if output is OutputFormat.json:
        print_json(run)
    else:
        echo(f"submitted run {run['id']} ({run['name']}), workflow {run['workflow_id']}")
        echo(f"console: {api_url.rstrip('/')}/runs/{run['id']}")
    if wait:
        wait_for_run(run["id"], token=token, api_url=api_url, timeout_s=timeout,
                     poll_s=poll_interval)


@train_app.command("placebo")
def train_placebo(
    run_ref: RunArgument, wait: WaitOption = False, timeout: TimeoutOption = 0,
    poll_interval: PollOption = 2.0, output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """Submit the placebo of one of your runs: the same config and seed with the task reward
    zeroed. A threshold that requires the placebo check compares candidates with its last
    checkpoint."""
    run_id = _resolve(run_ref, token, api_url)
    run = api_call("POST", f"/api/runs/{quoted(run_id)}/placebo", token=token,
                   api_url=api_url, body={})
    if output is OutputFormat.json:
        print_json(run)
    else:
        echo(f"submitted placebo run {run['id']} ({run['name']}) of run {run_id}, workflow"
             f" {run['workflow_id']}; it proposes nothing, its last checkpoint is the placebo")
    if wait:
        wait_for_run(run["id"], token=token, api_url=api_url, timeout_s=timeout,
                     poll_s=poll_interval)


RUN_COLUMNS = (field("id", "id", is_id=True), field("name", "name"),
               field("submitted by", "submitted_by"), field("status", "status"),
               Column("iterations", lambda r: f"{r['iterations_done']} of {r['iterations']}"),
               Column("last reward", lambda r: number_text(r.get("last_reward"))),
               Column("last success", lambda r: share_text(r.get("last_success"))),
               field("created", "created_at"))


@train_app.command("list")
def train_list(
    status: Annotated[RunStatus | None, typer.Option(
        "--status", case_sensitive=False, help="Only runs in this status.")] = None,
    submitted_by: Annotated[str | None, typer.Option(
        "--submitted-by", help="Only runs of this person.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=200)] = 50,
    output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """Training runs, newest first."""
    from urllib.parse import urlencode

    query = {"limit": limit, **({"status": status.value} if status else {}),
             **({"submitted_by": submitted_by} if submitted_by else {})}
    page = api_call("GET", f"/api/runs?{urlencode(query)}", token=token, api_url=api_url)
    print_rows(page["items"], RUN_COLUMNS, output, json_data=page)


def _show(run: dict[str, Any], api_url: str) -> None:
    echo(f"run {run['id']} ({run['name']}) by {run['submitted_by']}: {run['status']}, "
         f"{run['progress']['summary']}")
    if run.get("status_reason"):
        echo(f"  reason: {run['status_reason']}")
    if run["progress"].get("starved"):
        echo(f"  {run['progress']['starved']['message']}")
    if run["metrics"]:
        echo(f"  {_metrics_line(run['metrics'][-1])}")
    for row in run.get("tags") or []:  # reward and success per tag of the run's tasks
        success = "?" if row.get("success") is None else f"{row['success']:.0%}"
        reward = "?" if row.get("reward") is None else f"{row['reward']:.4g}"
        echo(f"  tag {row['tag']}: reward={reward} success={success}"
             f" (iteration {row['iteration']})")
    for alarm in run["alarms"]:
        echo(f"  alarm {alarm['name']} at iteration {alarm['iteration']}")
    if run["status"] == RunStatus.paused:
        echo(f"  paused: `triloop train resume {run['id']}` goes on, "
             f"`triloop train cancel {run['id']}` stops it")
    elif run["status"] == RunStatus.completed_with_alarms:
        echo("  completed with stability alarms: a candidate proposed within the threshold's"
             " alarm window waits at the stability gate for an operator's `triloop promotions"
             " override-alarms` (or is rejected)")
    if run["status"] in FINISHED_RUN_STATUSES or run.get("proposed"):
        for line in proposed_lines(run.get("proposed") or [], api_url):
            echo(f"  {line}")


@train_app.command("show")
def train_show(
    run_ref: RunArgument, wait: WaitOption = False, timeout: TimeoutOption = 0,
    poll_interval: PollOption = 2.0, output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """A run's status, latest metrics and alarms; --wait follows it to the end."""
    run_id = _resolve(run_ref, token, api_url)
    if wait:
        wait_for_run(run_id, token=token, api_url=api_url, timeout_s=timeout,
                     poll_s=poll_interval)
    run = api_call("GET", f"/api/runs/{quoted(run_id)}", token=token, api_url=api_url)
    if output is OutputFormat.json:
        print_json(run)
    else:
        _show(run, api_url)


# `train status` is what the README used before `show`; both names work.
train_app.command("status", help="Same as `train show`.")(train_show)
train_app.command("compare")(train_compare)


@train_app.command("logs")
def train_logs(
    run_ref: RunArgument,
    follow: Annotated[bool, typer.Option(
        "--follow", "-f", help="Keep printing new iterations until the run ends.")] = False,
    poll_interval: PollOption = 2.0, output: OutputOption = OutputFormat.table,
    token: TokenOption = None, api_url: ApiOption = DEFAULT_API,
) -> None:
    """One line per iteration (metrics and alarms); --output json prints one object a line."""
    import json

    run_id = _resolve(run_ref, token, api_url)
    after = -1
    while True:
        metrics = api_call("GET", f"/api/runs/{quoted(run_id)}/metrics?after={after}",
                           token=token, api_url=api_url)
        for point in sorted(metrics["metrics"], key=lambda p: p["iteration"]):
            echo(json.dumps(point) if output is OutputFormat.json else _metrics_line(point))
            after = max(after, point["iteration"])
        if not follow or metrics["status"] in FINISHED_RUN_STATUSES:
            return
        time.sleep(poll_interval)


RunAction = Literal["pause", "resume", "cancel"]
# What --wait waits for after each request: the state that was asked for, or an end.
_REACHED: dict[RunAction, Callable[[str], bool]] = {
    "pause": lambda s: s == RunStatus.paused or s in FINISHED_RUN_STATUSES,
    "resume": lambda s: s not in (RunStatus.paused, RunStatus.submitted),
    "cancel": lambda s: s in FINISHED_RUN_STATUSES,
}


def _control_run(action: RunAction, run_ref: str, reason: str | None, *, wait: bool,
                 timeout: float, poll_interval: float, output: OutputFormat,
                 token: str | None, api_url: str) -> None:
    run_id = _resolve(run_ref, token, api_url)
    run = api_call("POST", f"/api/runs/{quoted(run_id)}/{action}", token=token,
                   api_url=api_url, body={"reason": reason} if reason else {})
    if output is OutputFormat.json and not wait:
        print_json(run)
    elif output is OutputFormat.table:
        echo(f"asked to {action} run {run['id']} ({run['name']}); it is {run['status']}. The"
             " learning loop checks the request with the policy and applies it between steps.")
    if wait:
        reached = wait_for_run(run_id, token=token, api_url=api_url, timeout_s=timeout,
                               poll_s=poll_interval, done=_REACHED[action])
        if output is OutputFormat.json:
            print_json(reached)
        if action == "resume":
            # Resumed: now follow it to its end like `show --wait`.
            wait_for_run(run_id, token=token, api_url=api_url, timeout_s=timeout,
                         poll_s=poll_interval)
        elif action == "pause" and reached["status"] != RunStatus.paused:
            _exit_for(run_id, reached["status"], token=token, api_url=api_url)


@train_app.command("pause")
def train_pause(run_ref: RunArgument, reason: ReasonOption = None, wait: WaitOption = False,
                timeout: TimeoutOption = 0, poll_interval: PollOption = 2.0,
                output: OutputOption = OutputFormat.table, token: TokenOption = None,
                api_url: ApiOption = DEFAULT_API) -> None:
    """Pause one of your runs after its current iteration (--wait: until it has paused)."""
    _control_run("pause", run_ref, reason, wait=wait, timeout=timeout,
                 poll_interval=poll_interval, output=output, token=token, api_url=api_url)


@train_app.command("resume")
def train_resume(run_ref: RunArgument, reason: ReasonOption = None, wait: WaitOption = False,
                 timeout: TimeoutOption = 0, poll_interval: PollOption = 2.0,
                 output: OutputOption = OutputFormat.table, token: TokenOption = None,
                 api_url: ApiOption = DEFAULT_API) -> None:
    """Resume one of your paused runs, e.g. one an alarm paused (--wait: to its end)."""
    _control_run("resume", run_ref, reason, wait=wait, timeout=timeout,
                 poll_interval=poll_interval, output=output, token=token, api_url=api_url)


@train_app.command("cancel")
def train_cancel(run_ref: RunArgument, reason: ReasonOption = None, wait: WaitOption = False,
                 timeout: TimeoutOption = 0, poll_interval: PollOption = 2.0,
                 output: OutputOption = OutputFormat.table, token: TokenOption = None,
                 api_url: ApiOption = DEFAULT_API) -> None:
    """Cancel one of your runs; checkpoints already written stay in its lineage."""
    _control_run("cancel", run_ref, reason, wait=wait, timeout=timeout,
                 poll_interval=poll_interval, output=output, token=token, api_url=api_url)
