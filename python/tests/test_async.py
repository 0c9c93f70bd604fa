"""The async API against the same server: its own sandbox created and killed (the only other
one of the suite), and the session sandbox reached with AsyncSandbox.connect."""

from __future__ import annotations

import asyncio
import hashlib
from typing import AsyncIterator, List

import pytest

from bothy import (
    AsyncSandbox,
    CommandExitError,
    CommandTimeoutError,
    ConflictError,
    Sandbox,
)


async def apoll(check, what: str, deadline_s: float = 60.0):  # type: ignore[no-untyped-def]
    """Awaits ``check()`` until it answers something truthy, or fails naming ``what``."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while True:
        value = await check()
        if value:
            return value
        if loop.time() > end:
            raise AssertionError(f"gave up waiting for {what}")
        await asyncio.sleep(0.05)  # the poll's pace, not a wait for an outcome


async def test_create_list_kill_by_instance_and_by_id() -> None:
    async with await AsyncSandbox.create("seed", timeout=300, metadata={"suite": "async"}) as sbx:
        assert sbx.info["state"] == "running" and sbx.info["metadata"] == {"suite": "async"}
        assert sbx.sandbox_id in [s["sandbox_id"] for s in await AsyncSandbox.list()]
        assert (await sbx.set_timeout(600))["expires_at"]
        assert await sbx.is_running()
        assert (await sbx.commands.run("echo async")).stdout == "async\n"
        again = await AsyncSandbox.connect(sbx.sandbox_id)
        try:
            assert await AsyncSandbox.kill(sbx.sandbox_id) is True
            # A deleted sandbox is still described, but takes no command.
            with pytest.raises(ConflictError):
                await again.commands.run("true")
        finally:
            await again.close()
        # Killed twice is fine (the block kills it once more at its end).
        await AsyncSandbox.kill(sbx.sandbox_id, wait=True)
    assert await AsyncSandbox.kill("sbx_aaaaaaaaaaaaaaaaaaaa") is False
    assert sbx.sandbox_id not in [s["sandbox_id"] for s in await AsyncSandbox.list()]


async def test_commands_with_coroutine_callbacks_exit_codes_and_timeout(sandbox: Sandbox) -> None:
    sbx = await AsyncSandbox.connect(sandbox.sandbox_id)
    try:
        got: List[str] = []

        async def on_stdout(text: str) -> None:
            await asyncio.sleep(0)
            got.append(text)

        result = await sbx.commands.run("for i in 1 2 3; do echo line $i; done", on_stdout=on_stdout)
        assert result.stdout == "".join(got) == "line 1\nline 2\nline 3\n"
        with pytest.raises(CommandExitError) as raised:
            await sbx.commands.run("echo oops >&2; exit 9")
        assert (raised.value.exit_code, raised.value.stderr) == (9, "oops\n")
        with pytest.raises(CommandTimeoutError):
            await sbx.commands.run("sleep 600", timeout=1)
        # Several at once, each on its own kept socket.
        many = await asyncio.gather(*(sbx.commands.run(f"echo {i}") for i in range(4)))
        assert [r.stdout for r in many] == ["0\n", "1\n", "2\n", "3\n"]
        assert (await sbx.commands.exec("echo exec")).stdout == "exec\n"
    finally:
        await sbx.close()


async def test_background_stdin_reattach_kill_and_list(sandbox: Sandbox) -> None:
    sbx = await AsyncSandbox.connect(sandbox.sandbox_id)
    try:
        handle = await sbx.commands.run("cat", background=True, stdin=True)
        await handle.send_stdin("async in\n")

        async def echoed() -> bool:
            return "async in" in handle.stdout

        await apoll(echoed, "the echo")
        await handle.disconnect()
        again = await sbx.commands.connect(handle.command_id)
        await again.close_stdin()
        assert (await again.wait()).stdout == "async in\n"

        sleeper = await sbx.commands.run("sleep 600", background=True)
        assert sleeper.command_id in [c["command_id"] for c in await sbx.commands.list() if c["state"] == "running"]
        assert await sbx.commands.kill(sleeper.command_id) is True
        with pytest.raises(CommandExitError):
            await sleeper.wait()
    finally:
        await sbx.close()


async def _upload(n: int) -> AsyncIterator[bytes]:
    for i in range(n):
        yield bytes([i]) * 65536


async def test_files_and_pty(sandbox: Sandbox) -> None:
    sbx = await AsyncSandbox.connect(sandbox.sandbox_id)
    try:
        await sbx.files.make_dir("/workspace/apy")
        await sbx.files.write("/workspace/apy/t.txt", "async text")
        assert await sbx.files.read("/workspace/apy/t.txt") == "async text"
        info = await sbx.files.write("/workspace/apy/up.bin", _upload(32))
        expected = hashlib.sha256(b"".join(bytes([i]) * 65536 for i in range(32))).hexdigest()
        assert info.sha256 == expected
        down = hashlib.sha256()
        async for chunk in sbx.files.read_stream("/workspace/apy/up.bin"):
            down.update(chunk)
        assert down.hexdigest() == expected
        assert sorted(e.name for e in await sbx.files.list("/workspace/apy")) == ["t.txt", "up.bin"]
        assert await sbx.files.exists("/workspace/apy/t.txt")
        await sbx.files.remove("/workspace/apy", recursive=True)
        assert not await sbx.files.exists("/workspace/apy")

        data = bytearray()
        term = await sbx.pty.create(cols=90, rows=20, on_data=data.extend)
        await term.send_stdin("echo async-pty-$((6*7))\n")

        async def answered() -> bool:
            return b"async-pty-42" in data

        await apoll(answered, "the PTY's answer")
        await term.send_stdin("exit\n")
        assert (await term.wait()).exit_code == 0
    finally:
        await sbx.close()


async def test_ports_link_and_events(sandbox: Sandbox) -> None:
    sbx = await AsyncSandbox.connect(sandbox.sandbox_id)
    try:
        assert sbx.ports.url(3000).endswith(f"/sandboxes/{sbx.sandbox_id}/ports/3000/")
        assert (await sbx.ports.link(3000, ttl=60))["url"]
        events = AsyncSandbox.events(sandbox_id=sbx.sandbox_id, since=0)
        first = await events.__anext__()
        await events.aclose()  # type: ignore[attr-defined]
        assert first["type"] == "sandbox.created"
    finally:
        await sbx.close()
