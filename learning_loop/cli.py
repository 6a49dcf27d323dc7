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
