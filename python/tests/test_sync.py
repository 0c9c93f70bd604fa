"""The sync API against a real server and sandbox: lifecycle, commands (callbacks, exit codes,
timeouts, background handles, stdin, re-attach, a long stream with backpressure), PTY, files,
ports, events."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
from typing import Iterator, List

import httpx
import pytest

from bothy import (
    CommandHandle,
    CommandExitError,
    CommandTimeoutError,
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    Sandbox,
)

from conftest import poll


def test_create_connect_list_info_and_timeout(sandbox: Sandbox) -> None:
    assert sandbox.sandbox_id.startswith("sbx_")
    assert sandbox.info["metadata"] == {"suite": "python-sdk"}
    assert sandbox.sandbox_id in [s["sandbox_id"] for s in Sandbox.list()]
    other = Sandbox.connect(sandbox.sandbox_id)
    try:
        assert other.is_running()
        before = other.get_info()["expires_at"]
        after = other.set_timeout(1200)["expires_at"]
        assert before and after and after > before
    finally:
        other.close()


def test_run_streams_to_callbacks_and_raises_on_exit_codes(sandbox: Sandbox) -> None:
    out: List[str] = []
    err: List[str] = []
    result = sandbox.commands.run(
        'echo "$GREETING from $(pwd)"; echo warn >&2',
        envs={"GREETING": "hello"},
        cwd="/tmp",
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert (result.exit_code, result.stdout, result.stderr) == (0, "hello from /tmp\n", "warn\n")
    assert "".join(out) == "hello from /tmp\n" and "".join(err) == "warn\n"

    with pytest.raises(CommandExitError) as raised:
        sandbox.commands.run("echo partial; echo broke >&2; exit 3")
    assert (raised.value.exit_code, raised.value.stdout, raised.value.stderr) == (3, "partial\n", "broke\n")
    assert "exited with code 3" in str(raised.value)
    assert sandbox.commands.run("exit 4", throw_on_error=False).exit_code == 4
    assert sandbox.commands.exec("echo via http").stdout == "via http\n"
    with pytest.raises(CommandExitError):
        sandbox.commands.exec("exit 5")


def test_a_command_past_its_timeout_is_killed(sandbox: Sandbox) -> None:
    with pytest.raises(CommandTimeoutError) as raised:
        sandbox.commands.run("echo started; sleep 600", timeout=1)
    assert raised.value.stdout == "started\n"
    listed = {c["command_id"]: c for c in sandbox.commands.list()}
    assert listed[raised.value.command_id]["timed_out"] is True
    assert listed[raised.value.command_id]["state"] == "exited"


def test_background_handle_stdin_reattach_and_kill(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("cat", background=True, stdin=True)
    assert handle.pid
    handle.send_stdin("first line\n")
    poll(lambda: "first line" in handle.stdout, "the echo of stdin")
    handle.disconnect()

    # Re-attached, the server replays what it kept, and stdin is still open.
    again = sandbox.commands.connect(handle.command_id)
    poll(lambda: "first line" in again.stdout, "the replayed output")
    again.send_stdin(b"second line\n")
    again.close_stdin()
    result = again.wait()
    assert result.exit_code == 0 and result.stdout == "first line\nsecond line\n"

    sleeper = sandbox.commands.run("sleep 600", background=True)
    assert sleeper.kill() is True
    with pytest.raises(CommandExitError) as killed:
        sleeper.wait()
    assert killed.value.exit_code is None and killed.value.signal == "SIGKILL"
    assert sleeper.kill() is False

    # Killed by id, as another process holding only the id would.
    other = sandbox.commands.run("sleep 600", background=True)
    other.disconnect()
    assert sandbox.commands.kill(other.command_id) is True
    assert sandbox.commands.kill(other.command_id) is False


# Streams /tmp/blob in 64 KiB writes, noting after each how many it has written, and waits for
# stdout to drain whenever the pipe is full: how far it got says how much the way holds.
PRODUCER = (
    "const fs = require('fs'); const fd = fs.openSync('/tmp/blob', 'r'); let n = 0;"
    "function more() { for (;;) { const b = Buffer.alloc(65536); const got = fs.readSync(fd, b);"
    " if (got === 0) return; n++; fs.writeFileSync('/tmp/progress', String(n));"
    " if (!process.stdout.write(b.subarray(0, got))) return process.stdout.once('drain', more); } }"
    "more();"
)


def test_a_long_stream_is_held_by_a_slow_reader_and_arrives_whole(sandbox: Sandbox) -> None:
    """32 MiB through a callback that first holds the reader: the command must stall far short of
    its end (every relay on the way waits for the reader), then everything arrives, in order,
    nothing dropped, and the client kept none of it in memory (keep_output=False)."""
    chunks = 512
    size = chunks * 64 * 1024
    sandbox.commands.run(f"head -c {size} /dev/urandom > /tmp/blob && rm -f /tmp/progress")
    digest = hashlib.sha256()
    count = [0]
    gate = threading.Event()

    def on_output(data: bytes, stream: str) -> None:
        if stream != "stdout":
            return
        if count[0] == 0:
            gate.wait(120)
        digest.update(data)
        count[0] += len(data)

    handle = sandbox.commands.run(
        f'exec node -e "{PRODUCER}"', background=True, on_output=on_output, keep_output=False
    )
    try:
        seen: List[int] = []

        def stalled() -> bool:
            out = sandbox.commands.exec("cat /tmp/progress 2>/dev/null || echo 0").stdout.strip()
            seen.append(int(out or "0"))
            return len(seen) >= 5 and seen[-1] > 0 and len(set(seen[-5:])) == 1

        poll(stalled, "the held command to stop writing", 120)
        # Without backpressure it would have written all of it into buffers on the way.
        assert seen[-1] < chunks, f"the command wrote {seen[-1]} of {chunks} chunks with nobody reading"
    finally:
        gate.set()
    result = handle.wait()
    assert result.stdout == "" and handle.dropped_bytes == 0
    assert count[0] == size
    want = sandbox.commands.run("sha256sum /tmp/blob; rm /tmp/blob /tmp/progress").stdout.split()[0]
    assert digest.hexdigest() == want


def wait_for_size(term: CommandHandle, data: bytearray, size: bytes) -> None:
    """Asks the shell for its terminal size until it answers ``size``: a resize reaches the
    terminal on its own path, so a `stty size` sent right after it may still see the old one."""
    asked = [0]

    def answered() -> bool:
        if size in data:
            return True
        if asked[0] % 20 == 0:
            term.send_stdin("stty size\n")
        asked[0] += 1
        return False

    poll(answered, f"the terminal size {size!r}")


def test_pty_runs_a_shell_with_input_resize_and_exit(sandbox: Sandbox) -> None:
    data = bytearray()
    term = sandbox.pty.create(cols=100, rows=30, on_data=data.extend)
    term.send_stdin("echo pty-$((40+2))\n")
    poll(lambda: b"pty-42" in data, "the shell's answer")
    wait_for_size(term, data, b"30 100")
    term.resize(120, 40)
    wait_for_size(term, data, b"40 120")
    term.send_stdin("exit 7\n")
    assert term.wait().exit_code == 7


def _chunks(n: int, size: int) -> Iterator[bytes]:
    for i in range(n):
        yield bytes([i % 251]) * size


def test_files_read_write_stream_list_exists_remove(sandbox: Sandbox) -> None:
    files = sandbox.files
    assert files.make_dir("/workspace/py/sub") is True
    assert files.make_dir("/workspace/py/sub") is False
    info = files.write("/workspace/py/hello.txt", "héllo")
    assert info.size == len("héllo".encode())
    assert files.read("/workspace/py/hello.txt") == "héllo"
    files.write("/workspace/py/raw.bin", b"\x00\xffbytes")
    assert files.read_bytes("/workspace/py/raw.bin") == b"\x00\xffbytes"
    assert files.read("/workspace/py/raw.bin", format="bytes") == b"\x00\xffbytes"

    # Streaming both ways: 8 MiB from a generator up, then read back in chunks.
    up = files.write("/workspace/py/big.bin", _chunks(128, 64 * 1024))
    expected = hashlib.sha256(b"".join(_chunks(128, 64 * 1024))).hexdigest()
    assert (up.size, up.sha256) == (8 * 1024 * 1024, expected)
    down = hashlib.sha256()
    pieces = 0
    for chunk in files.read_stream("/workspace/py/big.bin"):
        down.update(chunk)
        pieces += 1
    assert down.hexdigest() == expected and pieces > 1

    names = {e.name: e for e in files.list("/workspace/py")}
    assert set(names) == {"sub", "hello.txt", "raw.bin", "big.bin"}
    assert names["sub"].type == "dir" and names["big.bin"].size == 8 * 1024 * 1024
    stat = files.stat("/workspace/py/hello.txt", sha256=True)
    with pytest.raises(ConflictError):
        files.write("/workspace/py/hello.txt", "lost update", if_match="0" * 64)
    files.write("/workspace/py/hello.txt", "updated", if_match=stat.sha256)
    assert files.rename("/workspace/py/hello.txt", "/workspace/py/sub/moved.txt").path.endswith("moved.txt")
    assert files.exists("/workspace/py/sub/moved.txt") and not files.exists("/workspace/py/hello.txt")
    with pytest.raises(NotFoundError):
        files.read("/workspace/py/hello.txt")
    with pytest.raises(InvalidArgumentError) as not_empty:
        files.remove("/workspace/py")
    assert not_empty.value.code == "file_error" and "not empty" in not_empty.value.message
    files.remove("/workspace/py", recursive=True)
    assert not files.exists("/workspace/py")


def test_ports_url_and_signed_link(sandbox: Sandbox) -> None:
    serve = "require('http').createServer((q, r) => r.end('served from the sandbox')).listen(8000)"
    server = sandbox.commands.run(f'exec node -e "{serve}"', background=True)
    try:
        poll(lambda: any(p["port"] == 8000 for p in sandbox.ports.list()), "port 8000 to listen")
        url = sandbox.ports.url(8000, "/index.html")
        assert url.endswith(f"/sandboxes/{sandbox.sandbox_id}/ports/8000/index.html")
        assert sandbox.get_host(8000).startswith(url.split("://")[1].split("/")[0])
        key = os.environ["BOTHY_API_KEY"]
        with httpx.Client() as client:
            assert client.get(url, headers={"authorization": f"Bearer {key}"}).text == "served from the sandbox"
            assert client.get(url).status_code == 401
        link = sandbox.ports.link(8000, ttl=300)
        assert link["expires_at"]
        with httpx.Client() as browser:
            # The first GET trades the token for a cookie for this port and comes back without it.
            # The cookie is Secure when the server sits behind TLS (as in the test's network lab),
            # so it is sent back by hand, as a browser on HTTPS would.
            landing = browser.get(link["url"])
            assert landing.status_code == 303 and "token=" not in landing.headers["location"]
            cookie = landing.headers["set-cookie"].split(";")[0]
            assert cookie.startswith("bothy_link=") and "HttpOnly" in landing.headers["set-cookie"]
            page = browser.get(url, headers={"cookie": cookie})
            assert page.status_code == 200 and page.text == "served from the sandbox"
        with pytest.raises(ValueError):
            sandbox.ports.url(70000)
    finally:
        server.kill()


def test_a_forwarded_local_port_carries_any_tcp_to_the_sandbox(sandbox: Sandbox) -> None:
    serve = "require('net').createServer((s) => s.on('data', (d) => s.write('echo:' + d))).listen(8001)"
    server = sandbox.commands.run(f'exec node -e "{serve}"', background=True)
    try:
        poll(lambda: any(p["port"] == 8001 for p in sandbox.ports.list()), "port 8001 to listen")
        with pytest.raises(ValueError):
            sandbox.ports.forward(8001, host="0.0.0.0")
        with sandbox.ports.forward(8001) as fwd:
            assert fwd.host == "127.0.0.1" and fwd.local_port > 0
            for word in (b"one", b"two"):  # two connections, each its own tunnel
                with socket.create_connection((fwd.host, fwd.local_port), timeout=30) as conn:
                    conn.sendall(word)
                    got = b""
                    while len(got) < len(b"echo:") + len(word):
                        chunk = conn.recv(1024)
                        assert chunk, "the forward closed before the answer"
                        got += chunk
                    assert got == b"echo:" + word
        with pytest.raises(OSError):
            socket.create_connection((fwd.host, fwd.local_port), timeout=5)
    finally:
        server.kill()


def test_events_replay_the_sandboxs_history(sandbox: Sandbox) -> None:
    events = Sandbox.events(sandbox_id=sandbox.sandbox_id, since=0)
    try:
        first = next(events)
    finally:
        events.close()  # type: ignore[attr-defined]
    assert first["type"] == "sandbox.created" and first["sandbox_id"] == sandbox.sandbox_id


def test_bad_input_is_an_invalid_argument(sandbox: Sandbox) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        sandbox.commands.run("true", envs={"not a name": "x"})
    assert raised.value.code in ("invalid_command", "invalid_request") and raised.value.message
