"""``GET /events`` (server-sent events) as an async iterator of parsed events."""

from __future__ import annotations

import json
from typing import AsyncIterator, List, Optional

import httpx

from ._http import AsyncHttp
from .errors import SandboxError
from .types import BothyEvent


async def open_events(http: AsyncHttp, *, sandbox_id: Optional[str] = None, since: Optional[int] = None) -> httpx.Response:
    """Opens the stream; once this answers, no new event is missed. Close it with ``aclose()``."""
    return await http.send(
        "GET",
        "/events",
        query={"sandbox_id": sandbox_id, "since": since},
        headers={"accept": "text/event-stream"},
        stream=True,
        timeout=False,
    )


async def read_events(res: httpx.Response) -> AsyncIterator[BothyEvent]:
    """The events of an open stream, as they arrive; closes the stream when iteration stops."""
    try:
        data: List[str] = []
        async for line in res.aiter_lines():
            # httpx before 0.24 keeps the line ending, later ones strip it.
            line = line.rstrip("\r\n")
            if line.startswith("data:"):
                data.append(line[5:].lstrip())
            elif line == "" and data:
                text, data = "\n".join(data), []
                try:
                    event = json.loads(text)
                except ValueError as err:
                    raise SandboxError("The server sent an event this SDK does not understand.", "bad_response") from err
                yield event
    finally:
        await res.aclose()


async def stream_events(
    http: AsyncHttp, *, sandbox_id: Optional[str] = None, since: Optional[int] = None
) -> AsyncIterator[BothyEvent]:
    """Yields events after ``since`` (replayed), then live ones until the caller stops iterating."""
    res = await open_events(http, sandbox_id=sandbox_id, since=since)
    async for event in read_events(res):
        yield event
