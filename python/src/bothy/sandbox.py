"""``Sandbox``: the sync API, a thin layer over ``AsyncSandbox`` run on the SDK's own event loop
thread (see ``_portal``). Output callbacks (``on_stdout``, ``on_data``) run on worker threads, one
call at a time per command, in order."""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union

from . import _portal
from ._commands_async import AsyncCommandHandle, AsyncCommands, AsyncPty, CommandResult
from ._files_async import AsyncFiles
from ._forward import AsyncPortForward
from ._sandbox_async import AsyncDesktop, AsyncPorts, AsyncSandbox
from .types import (
    BothyEvent,
    CommandInfo,
    DesktopActionResult,
    DesktopInfo,
    EntryInfo,
    LinkInfo,
    ListeningPort,
    SandboxInfo,
    SnapshotInfo,
    Screenshot,
    WriteInfo,
)


class CommandHandle:
    """A running (or finished) command: ``wait``, ``kill``, ``send_stdin``, ``disconnect``."""

    def __init__(self, handle: AsyncCommandHandle) -> None:
        """Made by ``commands.run(..., background=True)``, ``commands.connect`` or ``pty.create``."""
        self._h = handle

    @property
    def command_id(self) -> str:
        """The command's id in the sandbox."""
        return self._h.command_id

    @property
    def pid(self) -> Optional[int]:
        """Its process id inside the sandbox; None for a re-attached command."""
        return self._h.pid

    @property
    def stdout(self) -> str:
        """Everything it wrote to stdout so far."""
        return self._h.stdout

    @property
    def stderr(self) -> str:
        """Everything it wrote to stderr so far."""
        return self._h.stderr

    @property
    def exit_code(self) -> Optional[int]:
        """The exit code once it has exited; None while it runs."""
        return self._h.exit_code

    @property
    def dropped_bytes(self) -> int:
        """Bytes of older output the server had dropped before this handle attached."""
        return self._h.dropped_bytes

    def wait(self) -> CommandResult:
        """Waits for the end: CommandExitError on a non-zero exit (unless ``throw_on_error=False``),
        CommandTimeoutError when its timeout ran out."""
        return _portal.call(self._h.wait())

    def kill(self, signal: str = "SIGKILL") -> bool:
        """Sends ``signal`` to the command's process group; False when it had already ended."""
        return _portal.call(self._h.kill(signal))

    def send_stdin(self, data: Union[str, bytes]) -> None:
        """Writes to its stdin (started with ``stdin=True``, or a PTY)."""
        _portal.call(self._h.send_stdin(data))

    def close_stdin(self) -> None:
        """Closes its stdin."""
        _portal.call(self._h.close_stdin())

    def resize(self, cols: int, rows: int) -> None:
        """Resizes the terminal of a PTY command."""
        _portal.call(self._h.resize(cols, rows))

    def disconnect(self) -> None:
        """Lets go of the socket: a background command keeps running, a foreground one is killed."""
        _portal.call(self._h.disconnect())


class Commands:
    """Runs commands in one sandbox; ``sandbox.commands``."""

    def __init__(self, commands: AsyncCommands) -> None:
        """Made by the Sandbox."""
        self._c = commands

    def run(
        self,
        cmd: str,
        *,
        background: bool = False,
        envs: Optional[Dict[str, str]] = None,
        cwd: Optional[str] = None,
        timeout: Optional[float] = None,
        stdin: Union[str, bytes, bool, None] = None,
        on_stdout: Optional[Callable[[str], None]] = None,
        on_stderr: Optional[Callable[[str], None]] = None,
        on_output: Optional[Callable[[bytes, str], None]] = None,
        throw_on_error: bool = True,
        keep_output: bool = True,
    ) -> Any:
        """Runs ``cmd`` under ``/bin/sh -c`` and answers its CommandResult once it exits; with
        ``background=True``, a CommandHandle once it started. A non-zero exit raises
        CommandExitError (unless ``throw_on_error=False``); ``timeout`` (seconds) ends it with
        CommandTimeoutError. A slow callback slows the command's output, never memory."""
        out = _portal.call(
            self._c.run(
                cmd,
                background=background,
                envs=envs,
                cwd=cwd,
                timeout=timeout,
                stdin=stdin,
                on_stdout=_portal.offload(on_stdout),
                on_stderr=_portal.offload(on_stderr),
                on_output=_portal.offload(on_output),
                throw_on_error=throw_on_error,
                keep_output=keep_output,
            )
        )
        return CommandHandle(out) if isinstance(out, AsyncCommandHandle) else out

    def exec(
        self,
        cmd: str,
        *,
        envs: Optional[Dict[str, str]] = None,
        cwd: Optional[str] = None,
        timeout: Optional[float] = None,
        throw_on_error: bool = True,
    ) -> CommandResult:
        """Runs ``cmd`` to its end in one HTTP request (no streaming): the quickest short command."""
        return _portal.call(self._c.exec(cmd, envs=envs, cwd=cwd, timeout=timeout, throw_on_error=throw_on_error))

    def connect(
        self,
        command_id: str,
        *,
        on_stdout: Optional[Callable[[str], None]] = None,
        on_stderr: Optional[Callable[[str], None]] = None,
        throw_on_error: bool = True,
    ) -> CommandHandle:
        """Re-attaches to a command: replays what the server kept of its output, then streams it live."""
        return CommandHandle(
            _portal.call(
                self._c.connect(
                    command_id,
                    on_stdout=_portal.offload(on_stdout),
                    on_stderr=_portal.offload(on_stderr),
                    throw_on_error=throw_on_error,
                )
            )
        )

    def list(self) -> List[CommandInfo]:
        """The sandbox's commands (running and recently finished)."""
        return _portal.call(self._c.list())

    def kill(self, command_id: str, signal: str = "SIGKILL") -> bool:
        """Signals a command by id and waits for its end; False when it had already ended."""
        return _portal.call(self._c.kill(command_id, signal))


class Pty:
    """Terminals; ``sandbox.pty``."""

    def __init__(self, pty: AsyncPty) -> None:
        """Made by the Sandbox."""
        self._p = pty

    def create(
        self,
        *,
        cols: int = 80,
        rows: int = 24,
        on_data: Optional[Callable[[bytes], None]] = None,
        cmd: Optional[str] = None,
        cwd: Optional[str] = None,
        envs: Optional[Dict[str, str]] = None,
        timeout: Optional[float] = None,
        background: bool = False,
    ) -> CommandHandle:
        """Starts ``cmd`` (a login shell by default) on a terminal; output goes to ``on_data`` as bytes."""
        return CommandHandle(
            _portal.call(
                self._p.create(
                    cols=cols,
                    rows=rows,
                    on_data=_portal.offload(on_data),
                    cmd=cmd,
                    cwd=cwd,
                    envs=envs,
                    timeout=timeout,
                    background=background,
                )
            )
        )


class Files:
    """The sandbox's filesystem; ``sandbox.files``."""

    def __init__(self, files: AsyncFiles) -> None:
        """Made by the Sandbox."""
        self._f = files

    def read(self, path: str, *, format: str = "text") -> Union[str, bytes]:
        """Reads a whole file as text (default) or, with ``format="bytes"``, bytes."""
        return _portal.call(self._f.read(path, format=format))

    def read_bytes(self, path: str) -> bytes:
        """Reads a whole file as bytes."""
        return _portal.call(self._f.read_bytes(path))

    def read_stream(self, path: str, chunk_size: int = 64 * 1024) -> Iterator[bytes]:
        """Yields the file's bytes as they arrive, paced by your iteration."""
        return _portal.iterate(self._f.read_stream(path, chunk_size))

    def write(
        self,
        path: str,
        data: Union[str, bytes, Iterable[bytes]],
        *,
        mode: Union[int, str, None] = None,
        if_match: Optional[str] = None,
    ) -> WriteInfo:
        """Replaces the file atomically; ``data`` may be text, bytes or an iterable of bytes (an open
        binary file, a generator), which is streamed."""
        body: Any = data if isinstance(data, (str, bytes)) else _portal.aiter_sync(data)
        return _portal.call(self._f.write(path, body, mode=mode, if_match=if_match))

    def stat(self, path: str, *, sha256: bool = False) -> EntryInfo:
        """What is at ``path`` (NotFoundError when nothing is)."""
        return _portal.call(self._f.stat(path, sha256=sha256))

    def exists(self, path: str) -> bool:
        """Whether anything exists at ``path``."""
        return _portal.call(self._f.exists(path))

    def list(self, path: str) -> List[EntryInfo]:
        """The directory's entries."""
        return _portal.call(self._f.list(path))

    def make_dir(self, path: str, *, parents: bool = True) -> bool:
        """Makes a directory; False when it existed."""
        return _portal.call(self._f.make_dir(path, parents=parents))

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Removes a file or (``recursive``) a directory."""
        _portal.call(self._f.remove(path, recursive=recursive))

    def rename(self, old_path: str, new_path: str) -> EntryInfo:
        """Moves a file or directory."""
        return _portal.call(self._f.rename(old_path, new_path))


class Ports:
    """Ports as URLs; ``sandbox.ports``."""

    def __init__(self, ports: AsyncPorts) -> None:
        """Made by the Sandbox."""
        self._p = ports

    def list(self) -> List[ListeningPort]:
        """The TCP ports servers listen on inside the sandbox."""
        return _portal.call(self._p.list())

    def url(self, port: int, path: str = "/") -> str:
        """The URL that reaches ``port`` through the server (it takes the API key)."""
        return self._p.url(port, path)

    def host(self, port: int, path: str = "/") -> str:
        """``url(port)`` without its scheme."""
        return self._p.host(port, path)

    def link(self, port: int, *, ttl: Optional[int] = None) -> LinkInfo:
        """A signed link that opens ``port`` without an API key until it expires; share it like a key."""
        return _portal.call(self._p.link(port, ttl=ttl))

    def forward(self, port: int, *, local_port: int = 0, host: str = "127.0.0.1") -> "PortForward":
        """A local TCP port on loopback that reaches ``port`` inside the sandbox, for any TCP protocol
        (a database, SSH, VNC); use it in a ``with`` block or ``close()`` it."""
        return PortForward(_portal.call(self._p.forward(port, local_port=local_port, host=host)))


class PortForward:
    """A local port carried to a port inside a sandbox: ``host``, ``local_port``, ``close()``."""

    def __init__(self, forward: AsyncPortForward) -> None:
        """Made by ``Ports.forward``."""
        self._f = forward
        self.host = forward.host
        self.local_port = forward.local_port

    def close(self) -> None:
        """Stops listening and ends the connections it carries."""
        _portal.call(self._f.close())

    def __enter__(self) -> "PortForward":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Desktop:
    """The screen, mouse and keyboard of a ``desktop``-template sandbox; ``sandbox.desktop``."""

    def __init__(self, desktop: AsyncDesktop) -> None:
        """Made by the Sandbox."""
        self._d = desktop

    def start(self, width: Optional[int] = None, height: Optional[int] = None) -> DesktopInfo:
        """Starts the desktop where not running."""
        return _portal.call(self._d.start(width, height))

    def screenshot(self) -> Screenshot:
        """The screen as PNG bytes, with its size."""
        return _portal.call(self._d.screenshot())

    def act(self, action: Dict[str, Any]) -> DesktopActionResult:
        """Any one action in its wire form."""
        return _portal.call(self._d.act(action))

    def move(self, x: int, y: int) -> DesktopActionResult:
        """Moves the mouse."""
        return _portal.call(self._d.move(x, y))

    def click(self, x: int, y: int, *, button: str = "left", count: int = 1) -> DesktopActionResult:
        """Clicks at (x, y)."""
        return _portal.call(self._d.click(x, y, button=button, count=count))

    def type(self, text: str) -> DesktopActionResult:
        """Types text as keystrokes."""
        return _portal.call(self._d.type(text))

    def key(self, keys: str) -> DesktopActionResult:
        """Presses xdotool key names (``Return``, ``ctrl+l``)."""
        return _portal.call(self._d.key(keys))

    def scroll(self, x: int, y: int, direction: str = "down", amount: Optional[int] = None) -> DesktopActionResult:
        """Scrolls at (x, y)."""
        return _portal.call(self._d.scroll(x, y, direction, amount))

    def viewer_url(self, control: bool = False) -> str:
        """The live view's URL (it takes the API key)."""
        return self._d.viewer_url(control)

    def viewer_link(self, *, control: bool = False, ttl: Optional[int] = None) -> LinkInfo:
        """A signed link to the live view; share it like a key."""
        return _portal.call(self._d.viewer_link(control=control, ttl=ttl))


class _ClassOrInstance:
    """``Sandbox.kill(sandbox_id)`` on the class, ``sandbox.kill()`` on an instance."""

    def __init__(self, on_class: Any, on_instance: Any) -> None:
        self._on_class = on_class
        self._on_instance = on_instance
        self.__doc__ = on_instance.__doc__

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self._on_class.__get__(objtype, objtype)
        return self._on_instance.__get__(obj, objtype)


class Sandbox:
    """A sandbox (sync). Make one with ``Sandbox.create()`` or ``Sandbox.connect(id)``; ``with``
    kills it at the end of the block."""

    def __init__(self, inner: AsyncSandbox) -> None:
        """Use ``Sandbox.create`` or ``Sandbox.connect``."""
        self._s = inner
        #: The sandbox's id, ``sbx_...``.
        self.sandbox_id: str = inner.sandbox_id
        #: Commands: ``run``, ``exec``, ``connect``, ``list``, ``kill``.
        self.commands = Commands(inner.commands)
        #: Terminals.
        self.pty = Pty(inner.pty)
        #: The filesystem.
        self.files = Files(inner.files)
        #: Ports as URLs and signed links.
        self.ports = Ports(inner.ports)
        #: The desktop of a ``desktop``-template sandbox.
        self.desktop = Desktop(inner.desktop)

    @classmethod
    def create(
        cls,
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
    ) -> "Sandbox":
        """Boots a new sandbox and answers once it runs.

        ``template`` (default "seed"); ``timeout``: seconds until the server deletes it (default the
        server's, 1 h); ``policy``: host rules (wire names: ``allow_hosts``, ``rules``, ...);
        ``secrets``: vault secrets it may use (each a placeholder variable inside); ``volumes``: volumes
        of the tenant to mount, ``[{"name": ..., "path": ..., "read_only": False}]``; ``on_timeout``:
        ``"delete"`` (default) or ``"sleep"`` (asleep at its timeout until a call or ``resume`` wakes it,
        deleted after the server's BOTHY_SLEEP_RETENTION_S); ``auto_wake=False``: after its timeout or a
        pause only ``resume`` wakes it (calls raise ConflictError ``sandbox_asleep``)."""
        return cls(
            _portal.call(
                AsyncSandbox.create(
                    template,
                    timeout=timeout,
                    metadata=metadata,
                    vcpu=vcpu,
                    memory_mib=memory_mib,
                    disk_mib=disk_mib,
                    max_processes=max_processes,
                    driver=driver,
                    internet=internet,
                    allow_out=allow_out,
                    deny_out=deny_out,
                    policy=policy,
                    secrets=secrets,
                    volumes=volumes,
                    snapshot=snapshot,
                    delete_on_disconnect=delete_on_disconnect,
                    on_timeout=on_timeout,
                    auto_wake=auto_wake,
                    idempotency_key=idempotency_key,
                    base_url=base_url,
                    api_key=api_key,
                    request_timeout=request_timeout,
                )
            )
        )

    @classmethod
    def connect(
        cls,
        sandbox_id: str,
        *,
        base_url: Optional[str] = None,
        api_key: Optional[str] = None,
        request_timeout: Optional[float] = None,
    ) -> "Sandbox":
        """A handle on an existing sandbox (NotFoundError when there is none, or it is another tenant's)."""
        return cls(
            _portal.call(
                AsyncSandbox.connect(sandbox_id, base_url=base_url, api_key=api_key, request_timeout=request_timeout)
            )
        )

    @staticmethod
    def list(
        *, base_url: Optional[str] = None, api_key: Optional[str] = None, request_timeout: Optional[float] = None
    ) -> List[SandboxInfo]:
        """The live sandboxes of the key's tenant (creating, running, paused, deleting)."""
        return _portal.call(AsyncSandbox.list(base_url=base_url, api_key=api_key, request_timeout=request_timeout))

    @classmethod
    def _kill_by_id(
        cls,
        sandbox_id: str,
        *,
        wait: bool = False,
        base_url: Optional[str] = None,
        api_key: Optional[str] = None,
        request_timeout: Optional[float] = None,
    ) -> bool:
        """Deletes a sandbox by id; False when there was none. ``wait``: answer once it is deleted."""
        kill = AsyncSandbox.kill(  # type: ignore[call-arg]
            sandbox_id, wait=wait, base_url=base_url, api_key=api_key, request_timeout=request_timeout
        )
        return bool(_portal.call(kill))

    def _kill(self, *, wait: bool = False) -> bool:
        """Deletes the sandbox and everything in it; safe twice. ``wait``: answer once it is deleted."""
        return bool(_portal.call(self._s.kill(wait=wait)))

    #: ``Sandbox.kill(sandbox_id)`` or ``sandbox.kill()``: deletes the sandbox.
    kill = _ClassOrInstance(_kill_by_id, _kill)

    @staticmethod
    def events(
        *,
        sandbox_id: Optional[str] = None,
        since: Optional[int] = None,
        base_url: Optional[str] = None,
        api_key: Optional[str] = None,
    ) -> Iterator[BothyEvent]:
        """Events of the tenant (or of ``sandbox_id``), replayed after ``since`` and then live while
        you iterate; ``close()`` the iterator to end the stream."""
        return _portal.iterate(AsyncSandbox.events(sandbox_id=sandbox_id, since=since, base_url=base_url, api_key=api_key))

    @property
    def info(self) -> SandboxInfo:
        """What the server last said about this sandbox."""
        return self._s.info

    def get_host(self, port: int) -> str:
        """Where ``port`` is reached, without the scheme."""
        return self._s.get_host(port)

    def get_info(self) -> SandboxInfo:
        """The sandbox as the server describes it now."""
        return _portal.call(self._s.get_info())

    def is_running(self) -> bool:
        """Whether its state is ``running``."""
        return _portal.call(self._s.is_running())

    def set_timeout(self, timeout: int) -> SandboxInfo:
        """It now expires ``timeout`` seconds from now."""
        return _portal.call(self._s.set_timeout(timeout))

    def pause(self) -> SandboxInfo:
        """Saves memory and stops the VM (QEMU only)."""
        return _portal.call(self._s.pause())

    def snapshot(self, *, name: Optional[str] = None, memory: Optional[bool] = None) -> SnapshotInfo:
        """Keeps the sandbox's files as a snapshot (frozen only for the copy); ``Sandbox.create(snapshot=...)`` starts from it."""
        return _portal.call(self._s.snapshot(name=name, memory=memory))

    def fork(
        self, count: int, *, name: Optional[str] = None, timeout: Optional[int] = None
    ) -> Tuple[SnapshotInfo, List["Sandbox"]]:
        """A snapshot of this sandbox and ``count`` new sandboxes from it, each with its own identity; all or none."""
        snap, children = _portal.call(self._s.fork(count, name=name, timeout=timeout))
        return snap, [Sandbox(child) for child in children]

    def resume(self) -> SandboxInfo:
        """Resumes a paused sandbox."""
        return _portal.call(self._s.resume())

    def audit(
        self, *, types: Optional[List[str]] = None, after: Optional[int] = None, limit: Optional[int] = None
    ) -> List[BothyEvent]:
        """The egress gateway's decisions about this sandbox, oldest first."""
        return _portal.call(self._s.audit(types=types, after=after, limit=limit))

    def close(self) -> None:
        """Closes this object's connections (the sandbox keeps running)."""
        _portal.call(self._s.close())

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self._kill()
        finally:
            self.close()
