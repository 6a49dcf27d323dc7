"""``/docs``: Swagger UI 5, vendored under the console's static files, drawing ``/openapi.json``.

FastAPI's default page loads Swagger UI from a CDN, so on a machine without internet it is
blank; and the ``swagger-ui-bundle`` package ships Swagger UI 4, which cannot read the
OpenAPI 3.1 document FastAPI writes ("Unable to render this definition"). So the page uses
Swagger UI 5.x from ``static/vendor/swagger-ui`` (``scripts/vendor_swagger_ui.sh`` pins its
files by sha256), served with the console's other static files, and works offline.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse

ASSETS = "/static/vendor/swagger-ui"


def install_api_docs(app: FastAPI) -> None:
    """Serve ``/docs`` from the vendored Swagger UI (no CDN; the console mounts ``/static``)."""

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json", title=f"{app.title} API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
        )
