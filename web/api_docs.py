"""``/docs``: Swagger UI served from the installed ``swagger-ui-bundle`` package.

FastAPI's default page loads Swagger UI's JavaScript and CSS from a CDN, so on a machine
without internet it is blank. Here the same files come from the package, under
``/docs/assets``, and the page works offline.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

ASSETS = "/docs/assets"


def install_api_docs(app: FastAPI) -> None:
    """Serve ``/docs`` and its assets from the package (no CDN)."""
    app.mount(ASSETS, StaticFiles(directory=swagger_ui_path), name="swagger-ui-assets")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json", title=f"{app.title} API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
        )
