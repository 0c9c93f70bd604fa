"""WebSocket connections for the command socket, across the websockets releases the SDK supports
(10 and later): the client API moved (``extra_headers`` became ``additional_headers``) and the
refused-handshake error changed shape, so both live here and nowhere else."""

from __future__ import annotations

import json
from typing import Any, Optional

from ._http import AsyncHttp
from .errors import ConnectionError, SandboxError, error_from_code, error_from_problem

try:  # websockets >= 14: the new asyncio implementation
    from websockets.asyncio.client import connect as _connect  # type: ignore[import-not-found,unused-ignore]

    _HEADERS_ARG = "additional_headers"
except ImportError:  # websockets 10-13
    from websockets.legacy.client import connect as _connect  # type: ignore[no-redef,unused-ignore]

    _HEADERS_ARG = "extra_headers"

from websockets.exceptions import ConnectionClosed, InvalidHandshake

#: The largest frame the SDK accepts; the server's output frames are far smaller.
MAX_FRAME_BYTES = 16 * 1024 * 1024
#: Frames read ahead of a slow reader: beyond these the socket stops reading and TCP pushes back.
READ_QUEUE = 16

__all__ = ["ConnectionClosed", "is_open", "open_socket"]


def is_open(ws: Any) -> bool:
    """Whether a socket of either websockets API is open."""
    legacy = getattr(ws, "open", None)
    if isinstance(legacy, bool):
        return legacy
    from websockets.protocol import State  # type: ignore[import-not-found,unused-ignore]

    return bool(ws.state is State.OPEN)


async def open_socket(http: AsyncHttp, path: str, query: str = "") -> Any:
    """Opens ``path`` as a WebSocket with the client's key; a refusal raises the server's typed error."""
    kwargs = {
        _HEADERS_ARG: http.config.auth_headers(),
        "max_size": MAX_FRAME_BYTES,
        "max_queue": READ_QUEUE,
        # The server pings; an idle kept socket must not be dropped by a client-side ping timeout.
        "ping_interval": None,
        "open_timeout": http.config.request_timeout,
    }
    try:
        return await _connect(http.config.ws_url(path) + query, **kwargs)
    except InvalidHandshake as err:
        raise await _refusal(http, path, err) from err
    except OSError as err:
        raise ConnectionError(
            f"Cannot reach bothy at {http.config.base_url} ({err}); is `bothy serve` running there?",
            "connection_failed",
        ) from err


async def _refusal(http: AsyncHttp, path: str, err: InvalidHandshake) -> SandboxError:
    response = getattr(err, "response", None)
    status: Optional[int] = getattr(err, "status_code", None) or getattr(response, "status_code", None)
    body = getattr(response, "body", None)
    if status is not None and body:
        return error_from_problem(status, bytes(body).decode("utf-8", "replace"))
    # websockets before 11 drops the refusal's body: the sandbox's own answer says why (not found,
    # not this key's), and only when it has nothing to say does the status alone classify it.
    parts = path.split("/")
    state = ""
    if len(parts) > 2 and parts[1] == "sandboxes":
        try:
            info = await http.json("GET", f"/sandboxes/{parts[2]}")
            state = f" (the sandbox is {info.get('state')})"
        except SandboxError as found:
            return found
    if status is None:
        return ConnectionError(f"The command socket was refused: {err}", "connection_failed")
    return error_from_code(f"http_{status}", f"The command socket was refused with HTTP {status}{state}.", status)


def parse_frame(data: Any) -> Any:
    """A server frame as JSON; anything else is a protocol error."""
    if isinstance(data, bytes):
        data = data.decode("utf-8", "replace")
    try:
        return json.loads(data)
    except ValueError as err:
        raise SandboxError(
            "The server sent a command frame this SDK does not understand; the server may be newer than the SDK.",
            "bad_response",
        ) from err
