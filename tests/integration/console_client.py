"""Sign a person in to the console in-process (the login form, its CSRF cookie, the session)."""

from __future__ import annotations

import re

import httpx

from tests.factories_web import Person


async def console_session(client: httpx.AsyncClient, person: Person) -> None:
    """Sign ``person`` in on ``client``; its cookie jar then holds the session."""
    client.cookies.clear()
    form = await client.get("/login")
    found = re.search(r'name="csrf_token" value="([^"]+)"', form.text)
    assert found, form.text
    signed = await client.post("/login", data={"token": person.token,
                                               "csrf_token": found.group(1), "next": "/"})
    assert signed.status_code == 303, signed.text


def csrf_of(html: str) -> str:
    """The session's CSRF token from any console page."""
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found
    return found.group(1)
