#!/usr/bin/python3
"""The execute server @e2b/code-interpreter talks to (port 49999 in the sandbox).

Each context is one IPython kernel (ipykernel, driven with jupyter_client). POST /execute runs
code in a context and streams what the kernel says as JSON lines, in the shapes the SDK parses:
stdout/stderr, result (one key per MIME type: text, png, ...), error (name, value, traceback),
number_of_executions and end_of_execution. Only Python is served.
"""
import fcntl
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from queue import Empty

from jupyter_client.manager import KernelManager

PORT = int(os.environ.get("CODE_INTERPRETER_PORT", "49999"))
DEFAULT_CWD = "/workspace" if os.path.isdir("/workspace") else "/"
LANGUAGES = ("python",)
# Figures come back as image/png display data at the end of a cell, as in a notebook.
SETUP_CODE = "%matplotlib inline"
# The SDK's names for the MIME types it knows; any other type keeps its MIME name.
FORMATS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}


class Context:
    def __init__(self, language, cwd):
        self.id = str(uuid.uuid4())
        self.language = language
        self.cwd = cwd
        # One execution at a time: a kernel runs cells in order anyway, and iopub is read by one caller.
        self.lock = threading.Lock()
        env = dict(os.environ)
        env.pop("MPLBACKEND", None)  # Agg from the template would swallow figures
        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(cwd=cwd, env=env)
        self.kc = None
        self._connect()

    def _connect(self):
        if self.kc is not None:
            self.kc.stop_channels()
        self.kc = self.km.blocking_client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)
        self.run_silent(SETUP_CODE)

    def run_silent(self, code):
        msg_id = self.kc.execute(code, silent=True, store_history=False)
        while True:
            msg = self.kc.get_iopub_msg(timeout=120)
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return

    def restart(self):
        with self.lock:
            self.km.restart_kernel(now=True)
            self._connect()

    def shutdown(self):
        try:
            self.kc.stop_channels()
        finally:
            self.km.shutdown_kernel(now=True)

    def describe(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def execute(self, code, env_vars, send, gone):
        """Runs code; send(obj) writes one line to the client and returns False once the client is
        gone; gone() says whether it went away while the cell is quiet."""
        with self.lock:
            if env_vars:
                self.run_silent(_set_env_code(env_vars))
            try:
                self._execute(code, send, gone)
            finally:
                if env_vars:
                    self.run_silent(_restore_env_code())

    def _execute(self, code, send, gone):
        msg_id = self.kc.execute(code, store_history=True, allow_stdin=False)
        connected = True

        def emit(obj):
            nonlocal connected
            if connected and not send(obj):
                # The caller went away: stop the cell, as a notebook's interrupt would.
                connected = False
                self.km.interrupt_kernel()

        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=1)
            except Empty:
                if connected and gone():
                    # The caller went away (its timeout, a kill): stop the cell, as a notebook's interrupt would.
                    connected = False
                    self.km.interrupt_kernel()
                if not self.km.is_alive():
                    emit({"type": "error", "name": "KernelDied", "value": "the kernel died", "traceback": ""})
                    return
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                emit({"type": content["name"], "text": content["text"], "timestamp": _now_us()})
            elif kind in ("execute_result", "display_data"):
                emit(_result(content["data"], kind == "execute_result"))
            elif kind == "error":
                emit(
                    {
                        "type": "error",
                        "name": content["ename"],
                        "value": content["evalue"],
                        "traceback": "\n".join(content["traceback"]),
                    }
                )
            elif kind == "execute_input":
                emit({"type": "number_of_executions", "execution_count": content["execution_count"]})
            elif kind == "status" and content["execution_state"] == "idle":
                emit({"type": "end_of_execution"})
                return


def _result(data, is_main):
    out = {"type": "result", "is_main_result": is_main}
    for mime, value in data.items():
        out[FORMATS.get(mime, mime)] = value
    return out


def _now_us():
    return int(time.time() * 1_000_000)


def _set_env_code(env_vars):
    return (
        "import os as __e2b_os\n"
        f"__e2b_saved_env = {{k: __e2b_os.environ.get(k) for k in {list(env_vars)!r}}}\n"
        f"__e2b_os.environ.update({dict(env_vars)!r})\n"
    )


def _restore_env_code():
    return (
        "for __k, __v in __e2b_saved_env.items():\n"
        "    if __v is None: __e2b_os.environ.pop(__k, None)\n"
        "    else: __e2b_os.environ[__k] = __v\n"
        "del __e2b_saved_env\n"
    )


class Contexts:
    def __init__(self):
        self.lock = threading.Lock()
        self.by_id = {}
        self.defaults = {}

    def create(self, language, cwd):
        ctx = Context(language, cwd)
        with self.lock:
            self.by_id[ctx.id] = ctx
        return ctx

    def default(self, language):
        with self.lock:
            ctx = self.defaults.get(language)
            if ctx is None:
                ctx = Context(language, DEFAULT_CWD)
                self.defaults[language] = ctx
                self.by_id[ctx.id] = ctx
            return ctx

    def get(self, ctx_id):
        with self.lock:
            return self.by_id.get(ctx_id)

    def remove(self, ctx_id):
        with self.lock:
            ctx = self.by_id.pop(ctx_id, None)
            for lang, d in list(self.defaults.items()):
                if d is ctx:
                    del self.defaults[lang]
        if ctx is not None:
            ctx.shutdown()
        return ctx is not None

    def all(self):
        with self.lock:
            return list(self.by_id.values())


CONTEXTS = Contexts()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "bothy-code-interpreter/0.1"

    def log_message(self, fmt, *args):
        sys.stderr.write("code-interpreter: " + (fmt % args) + "\n")

    def _json(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status, message):
        self._json(status, {"error": message})

    def _body(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return None
        return body if isinstance(body, dict) else None

    def _path(self):
        return self.path.split("?", 1)[0].rstrip("/") or "/"

    def do_GET(self):
        path = self._path()
        if path == "/health":
            return self._json(200, {"status": "ok"})
        if path == "/contexts":
            return self._json(200, [c.describe() for c in CONTEXTS.all()])
        self._error(404, f"no route {path}")

    def do_DELETE(self):
        parts = self._path().split("/")
        if len(parts) == 3 and parts[1] == "contexts":
            if CONTEXTS.remove(parts[2]):
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            return self._error(404, f"context {parts[2]} not found")
        self._error(404, f"no route {self._path()}")

    def do_POST(self):
        path = self._path()
        body = self._body()
        if body is None:
            return self._error(400, "the body must be a JSON object")
        parts = path.split("/")
        if path == "/execute":
            return self._execute(body)
        if path == "/contexts":
            language = body.get("language") or "python"
            if language not in LANGUAGES:
                return self._error(400, f"language {language} is not supported here; use python")
            cwd = body.get("cwd") or DEFAULT_CWD
            if not isinstance(cwd, str) or not os.path.isdir(cwd):
                return self._error(400, f"cwd {cwd} is not a directory in the sandbox")
            try:
                ctx = CONTEXTS.create(language, cwd)
            except Exception as err:  # a kernel that cannot start: say so rather than drop the connection
                return self._error(500, f"the kernel did not start: {err}")
            return self._json(200, ctx.describe())
        if len(parts) == 4 and parts[1] == "contexts" and parts[3] == "restart":
            ctx = CONTEXTS.get(parts[2])
            if ctx is None:
                return self._error(404, f"context {parts[2]} not found")
            try:
                ctx.restart()
            except Exception as err:
                return self._error(500, f"the kernel did not restart: {err}")
            return self._json(200, {})
        self._error(404, f"no route {path}")

    def _execute(self, body):
        code = body.get("code")
        if not isinstance(code, str):
            return self._error(400, "code must be a string")
        env_vars = body.get("env_vars") or {}
        if not isinstance(env_vars, dict) or not all(isinstance(v, str) for v in env_vars.values()):
            return self._error(400, "env_vars must map names to strings")
        ctx_id = body.get("context_id")
        if ctx_id:
            ctx = CONTEXTS.get(ctx_id)
            if ctx is None:
                return self._error(404, f"context {ctx_id} not found")
        else:
            language = body.get("language") or "python"
            if language not in LANGUAGES:
                return self._error(400, f"language {language} is not supported here; use python")
            try:
                ctx = CONTEXTS.default(language)
            except Exception as err:
                return self._error(500, f"the kernel did not start: {err}")

        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def send(obj):
            line = (json.dumps(obj) + "\n").encode()
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
                return True
            except OSError:
                return False

        def gone():
            # The client sends nothing more after its request: a readable socket means it closed.
            try:
                readable, _, _ = select.select([self.connection], [], [], 0)
                return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
            except OSError:
                return True

        ctx.execute(code, env_vars, send, gone)
        try:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            pass


def listening():
    try:
        socket.create_connection(("127.0.0.1", PORT), timeout=1).close()
        return True
    except OSError:
        return False


def ensure_started():
    """Starts the server detached unless it listens already, and waits until it does.

    bothy's E2B layer runs this before a request to port 49999 that finds nothing listening, so
    the server comes up on first use, and again after anything that ended it.
    """
    if listening():
        return 0
    with open("/tmp/code-interpreter.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two first requests start one server
        if not listening():
            with open("/tmp/code-interpreter.log", "ab") as log:
                subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                )
        deadline = time.monotonic() + 60
        while not listening():
            if time.monotonic() > deadline:
                sys.stderr.write("code-interpreter: not listening after 60 s; see /tmp/code-interpreter.log\n")
                return 1
            time.sleep(0.05)
    return 0


def main():
    if sys.argv[1:] == ["--ensure-started"]:
        sys.exit(ensure_started())
    # Loopback only: bothy's port proxy connects from inside the guest (the agent dials
    # 127.0.0.1), and the server runs code for whoever reaches it, so nothing on the network may.
    server = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
    server.daemon_threads = True
    # The default context starts with the server, so the first runCode does not wait for a kernel.
    threading.Thread(target=CONTEXTS.default, args=("python",), daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
