"""The console: server-rendered pages (Jinja2) and the static CSS/JS shipped with them.

No CDN: ``static/`` holds the one stylesheet and the small live-update script.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from web.console import (
    pages_audit,
    pages_environments,
    pages_faults,
    pages_governance,
    pages_runs,
    pages_transcripts,
)
from web.console.rendering import HERE, render_problem
from web.problems import ProblemRenderer

# Every module of console pages (a test walks their forms: each must be authorized).
PAGE_MODULES = (pages_runs, pages_governance, pages_environments, pages_transcripts,
                pages_faults, pages_audit)


def install_console(app: FastAPI) -> ProblemRenderer:
    """Mount the pages and static files; return the HTML error renderer."""
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    for module in PAGE_MODULES:
        app.include_router(module.router)
    # Pages link /static/favicon.svg; anything that asks the browser's default path gets it too.
    app.add_api_route("/favicon.ico", favicon, include_in_schema=False)
    return render_problem


async def favicon() -> FileResponse:
    """The console's icon, for browsers and pages (the API docs) that ask /favicon.ico."""
    return FileResponse(HERE / "static" / "favicon.svg", media_type="image/svg+xml")
