"""Entry point of ``python -m verifier``: the verifier process, as ``triloop_verifier``."""

from __future__ import annotations

import logging
import signal
import threading

from execution_loop.serving import TaskEnvironments
from triloop.config import get_settings
from triloop.db import role_engine
from verifier.service import run_forever


def main() -> None:
    """Poll for episodes to judge until SIGTERM or SIGINT."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = get_settings()
    engine = role_engine(settings, "verifier")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    run_forever(engine=engine, environments=TaskEnvironments(engine=engine), stop=stop)


if __name__ == "__main__":
    main()
