"""``AsyncSandbox``: create, connect, list, kill and the lifetime of a sandbox, with ``commands``,
``pty``, ``files``, ``ports`` and ``desktop`` for what runs inside. Everything goes over bothy's
public API; the connection pool is closed by ``close()`` (or the ``async with`` block, which also
kills the sandbox)."""

from __future__ import annotations

from typing import Any, AsyncIterator, Dict, List, Optional, Tuple, Type, TypeVar

from ._commands_async import AsyncCommands, AsyncPty
from ._events import stream_events
from ._files_async import AsyncFiles
from ._forward import AsyncPortForward, forward_port
from ._http import AsyncHttp, ConnectionConfig
from .errors import NotFoundError
from .types import (
    BothyEvent,
    DesktopActionResult,
    DesktopInfo,
    LinkInfo,
    ListeningPort,
    SandboxInfo,
    Screenshot,
    SnapshotInfo,
)

T = TypeVar("T", bound="AsyncSandbox")


def _check_port(port: int) -> None:
    if not isinstance(port, int) or port < 1 or port > 65535:
        raise ValueError(f"{port} is not a TCP port; use a number from 1 to 65535.")


class AsyncPorts:
    """Ports as URLs: what listens inside the sandbox and the server URL that reaches each port."""

    def __init__(self, http: AsyncHttp, sandbox_id: str) -> None:
        self._http = http
        self._id = sandbox_id

    async def list(self) -> List[ListeningPort]:
        """The TCP ports servers listen on inside the sandbox, with the address each is bound to."""
        return (await self._http.json("GET", f"/sandboxes/{self._id}/ports"))["ports"]  # type: ignore[no-any-return]

    def url(self, port: int, path: str = "/") -> str:
        """The URL that reaches ``port`` inside the sandbox through the server (it takes the API key);
        use ``ws://`` for a WebSocket."""
        _check_port(port)
        rest = path if path.startswith("/") else f"/{path}"
        return self._http.config.url(f"/sandboxes/{self._id}/ports/{port}{rest}")

    def host(self, port: int, path: str = "/") -> str:
        """``url(port)`` without its scheme, as E2B's ``get_host`` answers."""
        url = self.url(port, path)
        return url.split("://", 1)[1]

    async def link(self, port: int, *, ttl: Optional[int] = None) -> LinkInfo:
        """A signed link that opens ``port`` in a browser without an API key until ``expires_at``;
        anyone holding it gets in: share it like a key, for as short a time as will do."""
        _check_port(port)
        body = {} if ttl is None else {"ttl_s": ttl}
        return await self._http.json("POST", f"/sandboxes/{self._id}/port-links/{port}", json_body=body)  # type: ignore[no-any-return]

    async def forward(self, port: int, *, local_port: int = 0, host: str = "127.0.0.1") -> AsyncPortForward:
        """A local TCP port (``local_port``, 0: a free one) on loopback that reaches ``port`` inside the
        sandbox, for any TCP protocol; ``close()`` it when done."""
        _check_port(port)
        return await forward_port(self._http, self._id, port, local_port=local_port, host=host)


class AsyncDesktop:
    """The screen, mouse and keyboard of a sandbox of the ``desktop`` template, in screenshot pixels."""

    def __init__(self, http: AsyncHttp, sandbox_id: str) -> None:
        self._http = http
        self._base = f"/sandboxes/{sandbox_id}/desktop"

    async def start(self, width: Optional[int] = None, height: Optional[int] = None) -> DesktopInfo:
        """Starts the display, window manager, VNC server and Chromium where not running."""
        body: Dict[str, int] = {}
        if width is not None:
            body["width"] = width
        if height is not None:
            body["height"] = height
        return await self._http.json("POST", f"{self._base}/start", json_body=body)  # type: ignore[no-any-return]

    async def screenshot(self) -> Screenshot:
        """The screen as PNG bytes, with its size."""
        res = await self._http.send("GET", f"{self._base}/screenshot")
        return Screenshot(
            png=res.content,
            width=int(res.headers.get("x-screen-width", "0")),
            height=int(res.headers.get("x-screen-height", "0")),
        )

    async def act(self, action: Dict[str, Any]) -> DesktopActionResult:
        """Any one action in its wire form: ``{"action": "click", "x": 10, "y": 20}``."""
        return await self._http.json("POST", f"{self._base}/actions", json_body=action)  # type: ignore[no-any-return]

    async def move(self, x: int, y: int) -> DesktopActionResult:
        """Moves the mouse to (x, y)."""
        return await self.act({"action": "move", "x": x, "y": y})

    async def click(self, x: int, y: int, *, button: str = "left", count: int = 1) -> DesktopActionResult:
        """Clicks ``button`` (left, middle, right) ``count`` times at (x, y)."""
        return await self.act({"action": "click", "x": x, "y": y, "button": button, "count": count})

    async def type(self, text: str) -> DesktopActionResult:
        """Types text as keystrokes into whatever has the focus."""
        return await self.act({"action": "type", "text": text})

    async def key(self, keys: str) -> DesktopActionResult:
        """Presses xdotool key names: ``Return``, ``ctrl+l``, several separated by spaces."""
        return await self.act({"action": "key", "keys": keys})

    async def scroll(self, x: int, y: int, direction: str = "down", amount: Optional[int] = None) -> DesktopActionResult:
        """Scrolls at (x, y) ``up``, ``down``, ``left`` or ``right``."""
        action: Dict[str, Any] = {"action": "scroll", "x": x, "y": y, "direction": direction}
        if amount is not None:
            action["amount"] = amount
        return await self.act(action)

    def viewer_url(self, control: bool = False) -> str:
        """The live view (noVNC) a person opens in a browser; it takes the API key."""
        return self._http.config.url(self._base + ("?control=1" if control else ""))

    async def viewer_link(self, *, control: bool = False, ttl: Optional[int] = None) -> LinkInfo:
        """A signed link to the live view that works without an API key until ``expires_at``
        (``control``: mouse and keyboard too). Share it like a key."""
        body: Dict[str, Any] = {"control": control}
        if ttl is not None:
            body["ttl_s"] = ttl
        return await self._http.json("POST", f"{self._base}/link", json_body=body)  # type: ignore[no-any-return]


class _ClassOrInstance:
    """A method that is a class method when called on the class (``AsyncSandbox.kill(id)``) and an
    instance method on an instance (``sandbox.kill()``), as E2B's SDK offers them."""

    def __init__(self, on_class: Any, on_instance: Any) -> None:
        self._on_class = on_class
        self._on_instance = on_instance
        self.__doc__ = on_instance.__doc__

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self._on_class.__get__(objtype, objtype)
        return self._on_instance.__get__(obj, objtype)


class AsyncSandbox:
    """A sandbox (async). Make one with ``await AsyncSandbox.create()`` or ``connect(id)``."""

    def __init__(self, http: AsyncHttp, info: SandboxInfo) -> None:
        """Use ``AsyncSandbox.create`` or ``AsyncSandbox.connect``."""
        self._http = http
        self._info = info
        #: The sandbox's id, ``sbx_...``.
        self.sandbox_id: str = info["sandbox_id"]
        #: Commands: ``run``, ``exec``, ``connect``, ``list``, ``kill``.
        self.commands = AsyncCommands(http, self.sandbox_id)
        #: Terminals: ``create``.
        self.pty = AsyncPty(self.commands)
        #: The filesystem: ``read``, ``write``, ``list``, ``exists``, ``remove``, ...
        self.files = AsyncFiles(http, self.sandbox_id)
        #: Ports as URLs and signed links.
        self.ports = AsyncPorts(http, self.sandbox_id)
        #: The desktop of a ``desktop``-template sandbox.
        self.desktop = AsyncDesktop(http, self.sandbox_id)

    @classmethod
    async def create(
        cls: Type[T],
        template: Optional[str] = None,
        *,
        timeout: Optional[int] = None,
        metadata: Optional[Dict[str, str]] = None,
        vcpu: Optional[int] = None,
        memory_mib: Optional[int] = None,
        disk_mib: Optional[int] = None,
        max_processes: Optional[int] = None,
        driver: Optional[str] = None,
        internet: Optional[bool] = None,
        allow_out: Optional[List[str]] = None,
        deny_out: Optional[List[str]] = None,
        policy: Optional[Dict[str, Any]] = None,
        secrets: Optional[List[str]] = None,
        volumes: Optional[List[Dict[str, Any]]] = None,
        snapshot: Optional[str] = None,
        delete_on_disconnect: Optional[bool] = None,
        on_timeout: Optional[str] = None,
        auto_wake: Optional[bool] = None,
        idempotency_key: Optional[str] = None,
        base_url: Optional[str] = None,
        api_key: Optional[str] = None,
        request_timeout: Optional[float] = None,
    ) -> T:
        """Boots a new sandbox and answers once it runs.

        ``template`` (default "seed"); ``timeout``: seconds until the server deletes it (default the
        server's, 1 h); ``policy``: host rules (wire names: ``allow_hosts``, ``rules``, ...);
        ``secrets``: vault secrets it may use (each a placeholder variable inside); ``volumes``: volumes
        of the tenant to mount, ``[{"name": ..., "path": ..., "read_only": False}]``; ``snapshot``: start
        from this snapshot of the tenant (id or name), on its template (leave ``template`` out);
        ``on_timeout``: ``"delete"`` (default) or ``"sleep"`` (asleep at its timeout until a call or
        ``resume`` wakes it, deleted after the server's BOTHY_SLEEP_RETENTION_S); ``auto_wake=False``:
        after its timeout or a pause only ``resume`` wakes it (calls raise ConflictError
        ``sandbox_asleep``)."""
        http = AsyncHttp(ConnectionConfig(base_url, api_key, request_timeout))
        fields: Dict[str, Any] = {
                "template": template,
                "timeout_s": timeout,
                "metadata": metadata,
                "vcpu": vcpu,
                "memory_mib": memory_mib,
                "disk_mib": disk_mib,
                "max_processes": max_processes,
                "driver": driver,
                "internet": internet,
                "allow_out": allow_out,
                "deny_out": deny_out,
                "policy": policy,
                "secrets": secrets,
                "volumes": volumes,
                "snapshot": snapshot,
                "delete_on_disconnect": delete_on_disconnect,
                "on_timeout": on_timeout,
                "auto_wake": auto_wake,
        }
        body = {k: v for k, v in fields.items() if v is not None}
        headers = {} if idempotency_key is None else {"idempotency-key": idempotency_key}
        try:
            info = await http.json("POST", "/sandboxes", json_body=body, headers=headers)
        except BaseException:
            await http.aclose()
            raise
        return cls(http, info)

    @classmethod
    async def connect(
        cls: Type[T],
        sandbox_id: str,
        *,
        base_url: Optional[str] = None,
        api_key: Optional[str] = None,
        request_timeout: Optional[float] = None,
    ) -> T:
        """A handle on an existing sandbox (NotFoundError when there is none, or it is another tenant's)."""
        http = AsyncHttp(ConnectionConfig(base_url, api_key, request_timeout))
        try:
            info = await http.json("GET", f"/sandboxes/{sandbox_id}")
        except BaseException:
            await http.aclose()
            raise
        return cls(http, info)

    @staticmethod
    async def list(
        *, base_url: Optional[str] = None, api_key: Optional[str] = None, request_timeout: Optional[float] = None
    ) -> List[SandboxInfo]:
        """The live sandboxes of the key's tenant (creating, running, paused, deleting)."""
        http = AsyncHttp(ConnectionConfig(base_url, api_key, request_timeout))
        try:
            return (await http.json("GET", "/sandboxes"))["sandboxes"]  # type: ignore[no-any-return]
        finally:
            await http.aclose()

    @classmethod
    async def _kill_by_id(
        cls,
        sandbox_id: str,
        *,
        wait: bool = False,
        base_url: Optional[str] = None,
        api_key: Optional[str] = None,
        request_timeout: Optional[float] = None,
    ) -> bool:
        """Deletes a sandbox by id; False when there was none. ``wait``: answer once it is deleted."""
        http = AsyncHttp(ConnectionConfig(base_url, api_key, request_timeout))
        try:
            await http.json("DELETE", f"/sandboxes/{sandbox_id}", query={"wait": wait or None})
            return True
        except NotFoundError:
            return False
        finally:
            await http.aclose()

    async def _kill(self, *, wait: bool = False) -> bool:
        """Deletes the sandbox and everything in it; safe to call twice. It answers once the sandbox is
        unreachable (``wait=True``: once its teardown ended). False when it was already gone."""
        await self.commands._close()
        try:
            self._info = await self._http.json("DELETE", f"/sandboxes/{self.sandbox_id}", query={"wait": wait or None})
            return True
        except NotFoundError:
            return False

    #: ``AsyncSandbox.kill(sandbox_id)`` or ``sandbox.kill()``: deletes the sandbox.
    kill = _ClassOrInstance(_kill_by_id, _kill)

    @staticmethod
    async def events(
        *,
        sandbox_id: Optional[str] = None,
        since: Optional[int] = None,
        base_url: Optional[str] = None,
        api_key: Optional[str] = None,
    ) -> AsyncIterator[BothyEvent]:
        """Sandbox and command events of the tenant (``sandbox.created``, ``command.exited``, ...),
        replayed after ``since`` and then live while you iterate."""
        http = AsyncHttp(ConnectionConfig(base_url, api_key))
        try:
            async for event in stream_events(http, sandbox_id=sandbox_id, since=since):
                yield event
        finally:
            await http.aclose()

    @property
    def info(self) -> SandboxInfo:
        """What the server last said about this sandbox (refresh with ``get_info``)."""
        return self._info

    @property
    def base_url(self) -> str:
        """The server this sandbox is reached through."""
        return self._http.config.base_url

    def get_host(self, port: int) -> str:
        """Where ``port`` inside the sandbox is reached, without the scheme."""
        return self.ports.host(port)

    async def get_info(self) -> SandboxInfo:
        """The sandbox as the server describes it now."""
        self._info = await self._http.json("GET", f"/sandboxes/{self.sandbox_id}")
        return self._info

    async def is_running(self) -> bool:
        """Whether its state is ``running``."""
        return (await self.get_info()).get("state") == "running"

    async def set_timeout(self, timeout: int) -> SandboxInfo:
        """The sandbox now expires ``timeout`` seconds from now (extends or shortens its life)."""
        self._info = await self._http.json(
            "POST", f"/sandboxes/{self.sandbox_id}/timeout", json_body={"timeout_s": timeout}
        )
        return self._info

    async def pause(self) -> SandboxInfo:
        """Saves memory to disk and stops the VM (QEMU; gVisor raises NotSupportedError)."""
        self._info = await self._http.json("POST", f"/sandboxes/{self.sandbox_id}/pause")
        return self._info

    async def snapshot(self, *, name: Optional[str] = None, memory: Optional[bool] = None) -> SnapshotInfo:
        """Keeps the sandbox's files (what it wrote over its template) as a snapshot, frozen only for
        the copy; ``memory=True`` raises NotSupportedError on gVisor."""
        body = {k: v for k, v in {"name": name, "memory": memory}.items() if v is not None}
        return await self._http.json(  # type: ignore[no-any-return]
            "POST", f"/sandboxes/{self.sandbox_id}/snapshots", json_body=body
        )

    async def fork(
        self, count: int, *, name: Optional[str] = None, timeout: Optional[int] = None
    ) -> Tuple[SnapshotInfo, List["AsyncSandbox"]]:
        """A snapshot of this sandbox and ``count`` new sandboxes from it, each with its own identity;
        all or none are made. Answers the snapshot and the new sandboxes."""
        body = {k: v for k, v in {"count": count, "name": name, "timeout_s": timeout}.items() if v is not None}
        result = await self._http.json("POST", f"/sandboxes/{self.sandbox_id}/fork", json_body=body)
        # Each child its own connection pool (same server and key): closing one leaves the others.
        return result["snapshot"], [AsyncSandbox(AsyncHttp(self._http.config), info) for info in result["sandboxes"]]

    async def resume(self) -> SandboxInfo:
        """Resumes a paused sandbox (commands and file calls also resume it on their own)."""
        self._info = await self._http.json("POST", f"/sandboxes/{self.sandbox_id}/resume")
        return self._info

    async def audit(
        self, *, types: Optional[List[str]] = None, after: Optional[int] = None, limit: Optional[int] = None
    ) -> List[BothyEvent]:
        """The egress gateway's decisions about this sandbox (``egress.allowed|denied|asked``, secrets'
        and approvals' events), oldest first; ``after`` pages on by ``seq``."""
        query = {"type": ",".join(types) if types else None, "after": after, "limit": limit}
        return (await self._http.json("GET", f"/sandboxes/{self.sandbox_id}/audit", query=query))["events"]  # type: ignore[no-any-return]

    async def close(self) -> None:
        """Closes this object's connections (the sandbox keeps running)."""
        await self.commands._close()
        await self._http.aclose()

    async def __aenter__(self: T) -> T:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self._kill()
        finally:
            await self.close()
