"""Console pages: environments, their versions, contract diffs and admission evidence."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from web.console.rendering import ConsoleGuard, page
from web.data import environments as envs
from web.deps import SessionDep
from web.pagination import CursorParam
from web.problems import not_found

router = APIRouter(include_in_schema=False)


@router.get("/environments", response_class=HTMLResponse)
async def environments_page(
    request: Request, guard: ConsoleGuard, db: SessionDep, cursor: CursorParam = None
) -> Response:
    """All environments."""
    await guard("read", "environment")
    listing = await db.read(envs.list_environments, limit=50, cursor=cursor)
    return page(request, "environments.html", guard.principal, title="Environments",
                listing=listing)


@router.get("/environments/{name}", response_class=HTMLResponse)
async def environment_page(
    request: Request, name: str, guard: ConsoleGuard, db: SessionDep,
    version: int | None = None, a: int | None = None, b: int | None = None,
) -> Response:
    """Versions, the contract of one, a diff between two, and its tasks' admission evidence."""
    await guard("read", "environment", id=name)
    await guard("read", "environment_version")
    detail = await db.read(envs.environment_detail, name=name)
    if detail is None:
        raise not_found("environment", name)
    numbers = [v.version for v in detail.versions]
    shown = next((v for v in detail.versions if v.version == version), None) or (
        detail.versions[0] if detail.versions else None)
    contract = None
    tasks = None
    if shown is not None:
        contract = await db.read(envs.version_detail, version_id=shown.id)
        if await guard.allows("read", "task"):
            tasks = await db.read(envs.list_tasks, limit=50, cursor=None,
                                  environment_version_id=shown.id)
    diff = None
    if a is not None and b is not None and a in numbers and b in numbers:
        diff = await db.read(envs.contract_diff, name=name, a=a, b=b)
    default_a = numbers[1] if len(numbers) > 1 else (numbers[0] if numbers else None)
    return page(request, "environment.html", guard.principal, title=f"Environment {name}",
                env=detail, shown=contract, tasks=tasks, diff=diff,
                a=a or default_a, b=b or (numbers[0] if numbers else None))
