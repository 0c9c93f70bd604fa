"""A local TCP port that reaches a port inside a sandbox: each connection accepted on loopback
gets its own WebSocket to the server's ``/sandboxes/{id}/tunnel/{port}``, which carries the bytes
both ways. Any TCP protocol works (a database, SSH, VNC), not only HTTP. Both directions wait for
the other side (``drain``, and the socket's bounded read queue), so a slow end slows the other."""

from __future__ import annotations

import asyncio
import ipaddress
from typing import Any, Set

from ._http import AsyncHttp
from ._ws import open_socket

#: The most one read from the local connection takes before it is sent on.
CHUNK = 64 * 1024


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class AsyncPortForward:
    """A listening local port; ``close()`` stops it and ends its open connections."""

    def __init__(self, server: asyncio.AbstractServer, host: str, local_port: int, tasks: Set["asyncio.Task[Any]"]) -> None:
        self._server = server
        self._tasks = tasks
        self.host = host
        self.local_port = local_port

    async def close(self) -> None:
        """Stops listening and ends the connections it carries."""
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()


async def _carry(http: AsyncHttp, path: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        ws = await open_socket(http, path)
    except Exception:
        writer.close()
        return

    async def up() -> None:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            await ws.send(data)
        await ws.close()

    async def down() -> None:
        async for message in ws:
            writer.write(message if isinstance(message, bytes) else message.encode())
            await writer.drain()

    tasks = [asyncio.ensure_future(up()), asyncio.ensure_future(down())]
    try:
        # Either end closing ends the connection: the other direction has nowhere left to go.
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await ws.close()
        writer.close()


async def forward_port(
    http: AsyncHttp, sandbox_id: str, port: int, *, local_port: int = 0, host: str = "127.0.0.1"
) -> AsyncPortForward:
    """Listens on ``host:local_port`` (0: a free port) and carries each connection to ``port``
    inside the sandbox. ``host`` must be a loopback address: a forward is never offered to the network."""
    if not _loopback(host):
        raise ValueError(f"{host} is not a loopback address: a forward listens on 127.0.0.1 or ::1 only.")
    path = f"/sandboxes/{sandbox_id}/tunnel/{port}"
    tasks: Set["asyncio.Task[Any]"] = set()

    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            tasks.add(task)
        try:
            await _carry(http, path, reader, writer)
        finally:
            if task is not None:
                tasks.discard(task)

    server = await asyncio.start_server(accepted, host, local_port)
    bound = server.sockets[0].getsockname()[1] if server.sockets else local_port
    return AsyncPortForward(server, host, int(bound), tasks)


__all__ = ["AsyncPortForward", "forward_port"]
