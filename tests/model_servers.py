"""triloop's OpenAI-compatible model server, run in a thread for a test."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from execution_loop.inference.server import create_app
from triloop.devstack.processes import free_port


@contextmanager
def serving(model_dir: Path, name: str, *, runtime_loading: bool,
            dev_mode: bool = False) -> Iterator[str]:
    """triloop's server in a thread; yields its base URL."""
    app = create_app(model_dir, served_model_name=name, device="cpu",
                     allow_runtime_loading=runtime_loading, max_loaded=2, dev_mode=dev_mode)
    with serving_app(app) as url:
        yield url


@contextmanager
def serving_app(app: FastAPI) -> Iterator[str]:
    """An app built by ``create_app`` served in a thread; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the model server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
