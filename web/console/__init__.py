"""The console: server-rendered pages (Jinja2) and the static CSS/JS shipped with them.

No CDN: ``static/`` holds the one stylesheet and the small live-update script.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from web.console import (
    pages_audit,
    pages_environments,
    pages_governance,
    pages_runs,
    pages_transcripts,
)
from web.console.rendering import HERE, render_problem
from web.problems import ProblemRenderer


def install_console(app: FastAPI) -> ProblemRenderer:
    """Mount the pages and static files; return the HTML error renderer."""
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    for module in (pages_runs, pages_governance, pages_environments, pages_transcripts,
                   pages_audit):
        app.include_router(module.router)
    return render_problem
