"""Console pages: an episode's transcript (turns paged) and lists of episodes.

Reads go through the same policy question as the API (``web.api.trajectories``): the
episode's purpose, and a training episode's run submitter, decide who may read it, and every
allowed read lands in the access log. The promotion page's sample (``_transcripts.html``)
links here; so does a run page whose run failed with ``NoTrainableData``.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, Response

from triloop.statuses import EpisodeStatus, Purpose
from web.api import trajectories as api
from web.console.rendering import ConsoleGuard, page
from web.data import transcripts
from web.data.transcript_sample import TranscriptSample, transcript_sample
from web.deps import Guard, SessionDep
from web.pagination import CursorParam
from web.problems import not_found

router = APIRouter(include_in_schema=False)
TURNS_PER_PAGE = 10


@router.get("/trajectories/{trajectory_id}", response_class=HTMLResponse)
async def trajectory_page(
    request: Request, trajectory_id: str, guard: ConsoleGuard, db: SessionDep,
    cursor: CursorParam = None, promotion: Annotated[str | None, Query(max_length=200)] = None,
) -> Response:
    """An episode: header, verdict, sandbox, then its turns a page at a time."""
    facts = await api.authorize_transcript(guard, db, trajectory_id)
    header = await db.read(transcripts.trajectory_header, trajectory_id=facts.id)
    turns = await db.read(transcripts.trajectory_turns, trajectory_id=facts.id,
                          limit=TURNS_PER_PAGE, cursor=cursor)
    if header is None or turns is None:
        raise not_found("trajectory", trajectory_id)
    back = {"promotion": promotion} if promotion else {}
    return page(request, "trajectory.html", guard.principal, title=f"Episode {facts.id}",
                episode=header, turns=turns, back_promotion=promotion,
                next_query=urlencode({**back, "cursor": turns.next_cursor})
                if turns.next_cursor else None, first_page=cursor is None)


@router.get("/trajectories", response_class=HTMLResponse)
async def trajectories_page(
    request: Request, guard: ConsoleGuard, db: SessionDep, cursor: CursorParam = None,
    run_id: Annotated[str | None, Query(max_length=200)] = None,
    iteration: Annotated[int | None, Query(ge=0, le=2**31 - 1)] = None,
    promotion_id: Annotated[str | None, Query(max_length=200)] = None,
    purpose: Purpose | None = None, status: EpisodeStatus | None = None,
) -> Response:
    """Episodes of a run (one iteration's, from a failed run's page) or of a promotion."""
    listing = await api.list_trajectories(
        guard, db, limit=25, cursor=cursor, run_id=run_id, promotion_id=promotion_id,
        checkpoint_id=None, purpose=purpose, batch_id=None, task_id=None, status=status,
        iteration=iteration)
    filters = {k: v for k, v in (("run_id", run_id), ("iteration", iteration),
                                 ("promotion_id", promotion_id), ("purpose", purpose),
                                 ("status", status)) if v is not None}
    return page(request, "trajectories.html", guard.principal, title="Episodes",
                listing=listing, filters=filters, query=urlencode(filters))


async def promotion_transcripts(guard: Guard, db: SessionDep,
                                promotion_id: str) -> TranscriptSample | None:
    """The promotion page's sample, or None when this person may not read eval transcripts."""
    if not await guard.allows("read", "trajectory", attrs={"purpose": Purpose.EVAL,
                                                          "promotion_id": promotion_id}):
        return None
    return await db.read(transcript_sample, promotion_id=promotion_id)
