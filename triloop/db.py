"""Database engines, one per service role, and a session helper.

Each service connects as its own PostgreSQL role (``triloop_<service>``) so the
GRANTs in the migrations back up the OPA policy: a learning-loop bug that skips
``authorize()`` still fails at the database.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine
from sqlmodel import Session, create_engine

from triloop.config import DatabaseRoleName, Settings

_engines: dict[str, Engine] = {}


def engine_for_url(url: str) -> Engine:
    """A pooled engine for a URL, created once per process."""
    engine = _engines.get(url)
    if engine is None:
        engine = create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)
        _engines[url] = engine
    return engine


def role_engine(settings: Settings, service: DatabaseRoleName) -> Engine:
    """The engine a service uses: its own database role."""
    return engine_for_url(settings.role_url(service))


def owner_engine(settings: Settings) -> Engine:
    """The owner's engine: migrations and the dev stack only, never a loop."""
    return engine_for_url(settings.owner_url())


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """One transaction: commit on success, roll back on any error."""
    with Session(engine, expire_on_commit=False) as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise


def dispose_all() -> None:
    """Close every pooled connection (tests, restarts)."""
    for engine in _engines.values():
        engine.dispose()
    _engines.clear()


# SQLSTATEs that mean something other than "PostgreSQL cannot be reached".
LOCK_NOT_AVAILABLE = "55P03"  # lock_timeout ran out (e.g. the audit chain head)
CREDENTIAL_REFUSED = "28000"  # a person's secret the database did not accept
INSUFFICIENT_PRIVILEGE = "42501"


def sqlstate(error: BaseException) -> str | None:
    """The SQLSTATE of a database error (SQLAlchemy's or psycopg's), if it has one."""
    original = getattr(error, "orig", error)
    state = getattr(original, "sqlstate", None)
    return state if isinstance(state, str) else None
