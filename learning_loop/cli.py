"""The learning loop's command group, mounted by ``triloop`` as ``triloop model``.

Torch and transformers are imported inside the commands so that ``triloop --help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

model_app = typer.Typer(help="Policy model checkpoints.", no_args_is_help=True)
console = Console()


@model_app.callback()
def model_group() -> None:
    """Policy model checkpoints."""
    # A callback keeps this a command group even while it has a single command.


@model_app.command("init-tiny")
def init_tiny(
    directory: Annotated[Path, typer.Argument(help="Folder to write the checkpoint into.")],
    seed: Annotated[int, typer.Option(help="Seed of the random initialisation.")] = 0,
) -> None:
    """Create the tiny random-init Llama model and its local tokenizer in DIRECTORY."""
    from learning_loop.tiny_model import create_tiny_model, tiny_model_info

    if directory.exists() and any(directory.iterdir()):
        console.print(f"[red]{directory} is not empty; choose a new folder.[/red]", soft_wrap=True)
        raise typer.Exit(1)
    path = create_tiny_model(directory, seed=seed)
    info = tiny_model_info(path)
    console.print(
        f"Created tiny model in {path}: {info.num_parameters:,} parameters, "
        f"vocabulary of {info.vocab_size} tokens, seed {seed}.",
        soft_wrap=True,
    )


@model_app.command("prune")
def prune(
    run: Annotated[str | None, typer.Option(
        "--run", help="Only this training run (default: every run).")] = None,
    keep_last: Annotated[int | None, typer.Option(
        "--keep-last", min=1, help="Iterations each run keeps (default: its RUN.yaml's"
        " checkpoints.keep_last, else TRILOOP_CHECKPOINT_KEEP_LAST).")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="List what would be pruned; mark and delete nothing.")] = False,
) -> None:
    """Apply checkpoint retention to every run (a sweep), as the learning loop does after
    each iteration; runs as the learning service (its database role, OPA token, store)."""
    from learning_loop.retention import CheckpointFiles, prune_run
    from learning_loop.store import get_run, run_ids
    from triloop.artifact_backends import open_shared_store
    from triloop.config import get_settings
    from triloop.db import role_engine
    from triloop.policy import Actor, Resource
    from triloop.retention import RetentionPolicy
    from triloop.wiring import build_authorizer

    settings = get_settings()
    policy = RetentionPolicy(settings.checkpoint_retention, settings.checkpoint_keep_last)
    if not policy.enabled and keep_last is None:
        console.print("Retention is off on this stack (TRILOOP_CHECKPOINT_RETENTION=false);"
                      " pass --keep-last to prune anyway.", soft_wrap=True)
        raise typer.Exit(1)
    engine = role_engine(settings, "learning")
    authorizer = build_authorizer(settings, "learning")
    files = CheckpointFiles(artifact_dir=settings.artifacts, store=open_shared_store(settings),
                            cache_dir=settings.artifact_cache)
    runs = run_ids(engine=engine, run_id=run)
    if run is not None and not runs:
        console.print(f"[red]No training run {run}.[/red]", soft_wrap=True)
        raise typer.Exit(1)
    total = 0
    for run_id in runs:
        row = get_run(engine=engine, run_id=run_id)
        configured = ((row.config or {}).get("checkpoints") or {}).get("keep_last") if row else None
        keep = keep_last or (configured if isinstance(configured, int) else policy.keep_last)
        if not dry_run:
            authorizer.authorize(Actor(service="learning"), "delete", Resource(
                "checkpoint", id=f"{run_id}:retention",
                attrs={"run_id": run_id, "keep_last": keep, "sweep": True}))
        report = prune_run(engine=engine, files=files, run_id=run_id, keep_last=keep,
                           dry_run=dry_run)
        for pruned in report.newly_pruned:
            verb = "would prune" if dry_run else "pruned"
            console.print(f"{run_id} iteration {pruned.iteration}: {verb} {pruned.checkpoint_id}"
                          f" ({pruned.rule})", soft_wrap=True)
        total += report.freed_bytes
    console.print(f"{'Dry run: nothing changed' if dry_run else f'{total:,} bytes freed'};"
                  f" {len(runs)} run(s) looked at.", soft_wrap=True)
