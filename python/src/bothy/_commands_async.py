"""``sandbox.commands`` and ``sandbox.pty`` (async): commands over the WebSocket
``/sandboxes/{id}/command``. Each frame is read by one task per command, and a callback that is
slow (or a coroutine that awaits) holds that task up, so the socket stops reading and the server's
relay stops the command's output at the source: memory stays bounded however much it prints.

A foreground command runs on a kept socket (``?keep=true``) taken from a small pool, which goes
back to the pool once the server is between commands; a background command gets a socket of its
own, since it outlives its handle (re-attach with ``commands.connect``)."""

from __future__ import annotations

import asyncio
import base64
import codecs
import json
import time
import weakref
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Dict, List, Optional, Set, Union

from ._http import AsyncHttp
from ._ws import ConnectionClosed, is_open, open_socket, parse_frame
from .errors import CommandExitError, CommandTimeoutError, ConnectionError, SandboxError, error_from_code
from .types import CommandInfo

#: Called with each piece of output as text (or bytes, for ``on_output``/``on_data``); may be a coroutine.
OutputCallback = Callable[[Any], Union[None, Awaitable[None]]]

#: A login shell: bash where the template has it, else sh.
DEFAULT_PTY_COMMAND = "if [ -x /bin/bash ]; then exec /bin/bash -l; else exec /bin/sh -l; fi"
#: A kept socket idle this long is closed rather than reused.
_KEPT_IDLE_S = 30.0


@dataclass
class CommandResult:
    """What a finished command left: its exit code (None when a signal ended it) and its output."""

    #: The command's id in the sandbox.
    command_id: str
    #: Its exit code; None when a signal ended it.
    exit_code: Optional[int]
    #: Everything it wrote to stdout (empty with ``keep_output=False``).
    stdout: str
    #: Everything it wrote to stderr.
    stderr: str
    #: The signal that ended it, e.g. ``SIGKILL``.
    signal: Optional[str] = None


async def _call(cb: Optional[OutputCallback], value: Any) -> None:
    if cb is None:
        return
    out = cb(value)
    if asyncio.iscoroutine(out) or isinstance(out, asyncio.Future):
        await out


class _KeptPool:
    """Idle kept command sockets of one sandbox object, most recently used first."""

    def __init__(self) -> None:
        self._idle: List[Any] = []
        self._closing: Set["asyncio.Task[None]"] = set()
        self._closed = False

    def take(self) -> Optional[Any]:
        now = time.monotonic()
        while self._idle:
            ws, since = self._idle.pop()
            if now - since < _KEPT_IDLE_S and is_open(ws):
                return ws
            self.close_later(ws, "idle")
        return None

    def give(self, ws: Any) -> None:
        if self._closed or not is_open(ws):
            self.close_later(ws, "done")
            return
        self._idle.append((ws, time.monotonic()))

    def close_later(self, ws: Any, reason: str) -> None:
        """Closes ``ws`` (1000) without waiting; ``close()`` waits for every such close."""
        task = asyncio.ensure_future(ws.close(1000, reason))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for ws, _ in idle:
            self.close_later(ws, "done")
        await asyncio.gather(*self._closing, return_exceptions=True)


class AsyncCommandHandle:
    """A running (or finished) command: ``wait``, ``kill``, ``send_stdin``, ``disconnect``."""

    def __init__(
        self,
        ws: Any,
        *,
        command_id: Optional[str],
        on_stdout: Optional[OutputCallback],
        on_stderr: Optional[OutputCallback],
        on_output: Optional[Callable[[bytes, str], Union[None, Awaitable[None]]]],
        throw_on_error: bool,
        keep_output: bool,
        pool: _KeptPool,
        reuse: bool,
        kept_by_server: bool = False,
    ) -> None:
        #: The command's id (known once it started).
        self.command_id = command_id or ""
        #: Its process id inside the sandbox; None for a re-attached command.
        self.pid: Optional[int] = None
        #: Bytes of older output the server had dropped before this handle attached.
        self.dropped_bytes = 0
        self._ws = ws
        self._pool = pool
        self._reuse = reuse
        self._kept_by_server = kept_by_server
        self._on = {"stdout": on_stdout, "stderr": on_stderr}
        self._on_output = on_output
        self._throw = throw_on_error
        self._keep = keep_output
        self._out: Dict[str, List[bytes]] = {"stdout": [], "stderr": []}
        self._decoders = {s: codecs.getincrementaldecoder("utf-8")("replace") for s in ("stdout", "stderr")}
        loop = asyncio.get_running_loop()
        self._started: "asyncio.Future[None]" = loop.create_future()
        self._exited: "asyncio.Future[Dict[str, Any]]" = loop.create_future()
        self._done = False
        self._let_go = False
        if command_id is not None:
            self._started.set_result(None)
        self._reader = asyncio.ensure_future(self._read())
        # Whoever awaits only one of the two must not leave the other's exception unretrieved.
        self._started.add_done_callback(_retrieve)
        self._exited.add_done_callback(_retrieve)

    @property
    def stdout(self) -> str:
        """Everything it wrote to stdout so far."""
        return b"".join(self._out["stdout"]).decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        """Everything it wrote to stderr so far."""
        return b"".join(self._out["stderr"]).decode("utf-8", "replace")

    @property
    def exit_code(self) -> Optional[int]:
        """The exit code once it has exited; None while it runs (or when a signal ended it)."""
        if self._exited.done() and not self._exited.exception():
            return self._exited.result().get("exit_code")
        return None

    @property
    def finished(self) -> bool:
        """Whether the command has ended (or this handle let go of it)."""
        return self._done

    async def _started_or_failed(self) -> None:
        await self._started

    async def wait(self) -> CommandResult:
        """Waits for the end: CommandExitError on a non-zero exit (unless ``throw_on_error=False``),
        CommandTimeoutError when its timeout ran out."""
        exit_ = await asyncio.shield(self._exited)
        await asyncio.shield(self._reader)
        result = CommandResult(
            command_id=self.command_id,
            exit_code=exit_.get("exit_code"),
            stdout=self.stdout,
            stderr=self.stderr,
            signal=exit_.get("signal"),
        )
        if exit_.get("timed_out"):
            raise CommandTimeoutError(self.command_id, result.stdout, result.stderr)
        if self._throw and result.exit_code != 0:
            raise CommandExitError(self.command_id, result.exit_code, result.stdout, result.stderr, result.signal)
        return result

    async def kill(self, signal: str = "SIGKILL") -> bool:
        """Sends ``signal`` to the command's process group; False when it had already ended."""
        if self._done:
            return False
        await self._send({"type": "signal", "signal": signal})
        return True

    async def send_stdin(self, data: Union[str, bytes]) -> None:
        """Writes to the command's stdin (it must have been started with ``stdin=True``)."""
        if isinstance(data, str):
            await self._send({"type": "stdin", "data": data})
        else:
            await self._send({"type": "stdin", "data": base64.b64encode(data).decode(), "encoding": "base64"})

    async def close_stdin(self) -> None:
        """Closes the command's stdin (end of input)."""
        await self._send({"type": "stdin_eof"})

    async def resize(self, cols: int, rows: int) -> None:
        """Resizes the terminal of a PTY command."""
        await self._send({"type": "resize", "cols": cols, "rows": rows})

    async def disconnect(self) -> None:
        """Lets go of the socket cleanly: a background command keeps running, a foreground one is killed."""
        if self._done:
            return
        self._fail(
            SandboxError(
                f"Disconnected from command {self.command_id}; it keeps running if it is a background command.",
                "disconnected",
            )
        )
        if not self._let_go:
            self._let_go = True
            await self._ws.close(1000, "client disconnected")
        await asyncio.gather(self._reader, return_exceptions=True)

    async def _send(self, frame: Dict[str, Any]) -> None:
        if self._done:
            raise SandboxError(f"Command {self.command_id} is no longer attached; nothing was sent.", "not_attached")
        try:
            await self._ws.send(json.dumps(frame))
        except ConnectionClosed as err:
            raise ConnectionError("The command socket closed; nothing was sent.", "connection_closed") from err

    def _fail(self, err: BaseException) -> None:
        if self._done:
            return
        self._done = True
        for fut in (self._started, self._exited):
            if not fut.done():
                fut.set_exception(err)

    def _release(self) -> None:
        if self._let_go:
            return
        self._let_go = True
        if self._reuse and self._kept_by_server:
            self._pool.give(self._ws)
        else:
            self._pool.close_later(self._ws, "done")

    async def _read(self) -> None:
        try:
            while not self._let_go:
                try:
                    frame = parse_frame(await self._ws.recv())
                except ConnectionClosed as closed:
                    self._fail(
                        ConnectionError(
                            f"The command socket closed ({closed}) before the command ended; re-attach with "
                            "commands.connect().",
                            "connection_closed",
                        )
                    )
                    self._let_go = True
                    return
                await self._on_frame(frame)
        except asyncio.CancelledError:
            self._fail(SandboxError("The command's reader was cancelled.", "disconnected"))
            raise
        except BaseException as err:  # a callback's own error ends the command's stream with it
            self._fail(err)
            if not self._let_go:
                self._let_go = True
                await self._ws.close(1000, "client error")

    async def _on_frame(self, frame: Dict[str, Any]) -> None:
        kind = frame.get("type")
        if self._done:
            # After an `error`, a kept socket is the pool's again once the server says `ready`.
            if kind == "ready":
                self._release()
            return
        if kind == "started":
            self.command_id = frame["command_id"]
            self.pid = frame.get("pid")
            if not self._started.done():
                self._started.set_result(None)
        elif kind in ("stdout", "stderr"):
            raw = frame.get("data", "")
            data = base64.b64decode(raw) if frame.get("encoding") == "base64" else raw.encode("utf-8")
            await self._output(kind, data)
        elif kind == "output_dropped":
            self.dropped_bytes += int(frame.get("bytes", 0))
        elif kind == "process_exited":
            self.command_id = frame.get("command_id", self.command_id)
            self._done = True
            if not self._started.done():
                self._started.set_result(None)
            self._exited.set_result(frame)
            # The server is between commands already: a kept socket may take the next one now.
            self._release()
        elif kind == "error":
            self._fail(error_from_code(str(frame.get("code")), str(frame.get("message"))))
            if not (self._reuse and self._kept_by_server):
                self._release()
        elif kind == "ready":
            self._kept_by_server = True

    async def _output(self, stream: str, data: bytes) -> None:
        if self._keep:
            self._out[stream].append(data)
        if self._on_output is not None:
            out = self._on_output(data, stream)
            if asyncio.iscoroutine(out):
                await out
        cb = self._on[stream]
        if cb is not None:
            text = self._decoders[stream].decode(data)
            if text:
                await _call(cb, text)


def _retrieve(fut: "asyncio.Future[Any]") -> None:
    if not fut.cancelled():
        fut.exception()


class AsyncCommands:
    """Runs commands in one sandbox; ``sandbox.commands``."""

    def __init__(self, http: AsyncHttp, sandbox_id: str) -> None:
        self._http = http
        self._id = sandbox_id
        self._pool = _KeptPool()
        self._handles: "weakref.WeakSet[AsyncCommandHandle]" = weakref.WeakSet()

    async def _close(self) -> None:
        # Background commands keep running in the sandbox; this object only lets go of them.
        for handle in list(self._handles):
            await handle.disconnect()
        await self._pool.close()

    async def run(
        self,
        cmd: str,
        *,
        background: bool = False,
        envs: Optional[Dict[str, str]] = None,
        cwd: Optional[str] = None,
        timeout: Optional[float] = None,
        stdin: Union[str, bytes, bool, None] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        on_output: Optional[Callable[[bytes, str], Union[None, Awaitable[None]]]] = None,
        throw_on_error: bool = True,
        keep_output: bool = True,
    ) -> Any:
        """Runs ``cmd`` under ``/bin/sh -c`` and answers its CommandResult once it exits; with
        ``background=True``, its AsyncCommandHandle once it started.

        ``timeout`` (seconds): the server kills it after that long (CommandTimeoutError).
        ``stdin``: text or bytes are written and stdin closed; ``True`` keeps it open for
        ``handle.send_stdin``. ``on_stdout``/``on_stderr`` get text as it arrives (a coroutine
        function may be given: reading waits for it). A non-zero exit raises CommandExitError
        unless ``throw_on_error=False``; ``keep_output=False`` keeps no output in memory."""
        handle = await self._start(
            cmd,
            background=background,
            envs=envs,
            cwd=cwd,
            timeout=timeout,
            stdin=stdin,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
            on_output=on_output,
            throw_on_error=throw_on_error,
            keep_output=keep_output,
        )
        if background:
            return handle
        try:
            return await handle.wait()
        except asyncio.CancelledError:
            # The caller gave up: closing the socket makes the server kill the foreground command.
            await handle.disconnect()
            raise

    async def _start(
        self,
        cmd: str,
        *,
        background: bool = False,
        envs: Optional[Dict[str, str]] = None,
        cwd: Optional[str] = None,
        timeout: Optional[float] = None,
        stdin: Union[str, bytes, bool, None] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        on_output: Optional[Callable[[bytes, str], Union[None, Awaitable[None]]]] = None,
        throw_on_error: bool = True,
        keep_output: bool = True,
        pty: Optional[Dict[str, int]] = None,
    ) -> AsyncCommandHandle:
        request: Dict[str, Any] = {"cmd": cmd}
        if cwd is not None:
            request["cwd"] = cwd
        if envs is not None:
            request["env"] = envs
        if timeout is not None:
            request["timeout_s"] = timeout
        if stdin is not None and stdin is not False:
            request["stdin"] = True
        if background:
            request["background"] = True
        if pty is not None:
            request["pty"] = pty
        path = f"/sandboxes/{self._id}/command"
        ws = None if background else self._pool.take()
        reused = ws is not None
        if ws is None:
            ws = await open_socket(self._http, path, "" if background else "?keep=true")
        handle = AsyncCommandHandle(
            ws,
            command_id=None,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
            on_output=on_output,
            throw_on_error=throw_on_error,
            keep_output=keep_output,
            pool=self._pool,
            reuse=not background,
            kept_by_server=reused,
        )
        self._handles.add(handle)
        try:
            await ws.send(json.dumps(request))
            await handle._started_or_failed()
            if isinstance(stdin, (str, bytes)):
                if stdin:
                    await handle.send_stdin(stdin)
                await handle.close_stdin()
        except BaseException:
            await handle.disconnect()
            raise
        return handle

    async def connect(
        self,
        command_id: str,
        *,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        on_output: Optional[Callable[[bytes, str], Union[None, Awaitable[None]]]] = None,
        throw_on_error: bool = True,
        keep_output: bool = True,
    ) -> AsyncCommandHandle:
        """Re-attaches to a command: replays what the server kept of its output, then streams it live."""
        ws = await open_socket(self._http, f"/sandboxes/{self._id}/commands/{command_id}")
        handle = AsyncCommandHandle(
            ws,
            command_id=command_id,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
            on_output=on_output,
            throw_on_error=throw_on_error,
            keep_output=keep_output,
            pool=self._pool,
            reuse=False,
        )
        self._handles.add(handle)
        return handle

    async def exec(
        self,
        cmd: str,
        *,
        envs: Optional[Dict[str, str]] = None,
        cwd: Optional[str] = None,
        timeout: Optional[float] = None,
        throw_on_error: bool = True,
    ) -> CommandResult:
        """Runs ``cmd`` to its end in one HTTP request (no WebSocket, no streaming): the quickest way
        to run a short command. Output past the server's 16 MiB per stream is dropped."""
        request: Dict[str, Any] = {"cmd": cmd}
        if cwd is not None:
            request["cwd"] = cwd
        if envs is not None:
            request["env"] = envs
        if timeout is not None:
            request["timeout_s"] = timeout
        answer = await self._http.json("POST", f"/sandboxes/{self._id}/commands", json_body=request, timeout=False)

        def text(stream: str) -> str:
            data = answer.get(stream, "")
            if answer.get(f"{stream}_encoding") == "base64":
                return base64.b64decode(data).decode("utf-8", "replace")
            return str(data)

        result = CommandResult(answer["command_id"], answer.get("exit_code"), text("stdout"), text("stderr"))
        result.signal = answer.get("signal")
        if answer.get("timed_out"):
            raise CommandTimeoutError(result.command_id, result.stdout, result.stderr)
        if throw_on_error and result.exit_code != 0:
            raise CommandExitError(result.command_id, result.exit_code, result.stdout, result.stderr, result.signal)
        return result

    async def list(self) -> List[CommandInfo]:
        """The sandbox's commands (running ones and recent finished ones) with their state."""
        return (await self._http.json("GET", f"/sandboxes/{self._id}/commands"))["commands"]  # type: ignore[no-any-return]

    async def kill(self, command_id: str, signal: str = "SIGKILL") -> bool:
        """Sends ``signal`` to a command by id and waits for it to end; False when it had already ended."""
        info = await self._http.json("GET", f"/sandboxes/{self._id}/commands/{command_id}")
        if info.get("state") != "running":
            return False
        handle = await self.connect(command_id, throw_on_error=False, keep_output=False)
        try:
            if not await handle.kill(signal):
                return False
            try:
                await handle.wait()
            except SandboxError:
                pass  # it ended either way; how is the command's own business
            return True
        finally:
            await handle.disconnect()


class AsyncPty:
    """An interactive shell (or any command) on a pseudo-terminal; ``sandbox.pty``."""

    def __init__(self, commands: AsyncCommands) -> None:
        self._commands = commands

    async def create(
        self,
        *,
        cols: int = 80,
        rows: int = 24,
        on_data: Optional[Callable[[bytes], Union[None, Awaitable[None]]]] = None,
        cmd: Optional[str] = None,
        cwd: Optional[str] = None,
        envs: Optional[Dict[str, str]] = None,
        timeout: Optional[float] = None,
        background: bool = False,
    ) -> AsyncCommandHandle:
        """Starts ``cmd`` (a login shell by default) on a ``cols`` x ``rows`` terminal and answers its
        handle once it runs. Output (stdout and stderr together, with the echo) goes to ``on_data``
        as bytes; input with ``send_stdin``, Ctrl-C as ``b"\\x03"``. ``wait`` does not raise on a
        non-zero exit."""
        on_output = None
        if on_data is not None:
            data_cb = on_data

            def on_output(data: bytes, _stream: str) -> Union[None, Awaitable[None]]:
                return data_cb(data)

        return await self._commands._start(
            cmd or DEFAULT_PTY_COMMAND,
            background=background,
            envs={"TERM": "xterm-256color", **(envs or {})},
            cwd=cwd,
            timeout=timeout,
            on_output=on_output,
            throw_on_error=False,
            pty={"cols": cols, "rows": rows},
        )
