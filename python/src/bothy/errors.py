"""Typed errors rebuilt from the server's problem+json ``code``.

Every error the SDK raises is a :class:`SandboxError`; the subclasses say what kind of failure it
is, so callers can ``except NotFoundError`` without matching strings. Each error carries the
server's own message (which says what to do next), its stable ``code`` and the HTTP ``status``.
A code this SDK does not know (a newer server) is classified by its HTTP status instead.
"""

from __future__ import annotations

import json
from typing import Dict, Optional, Type


class SandboxError(Exception):
    """Any error from bothy or this SDK: ``code`` is the server's stable code, ``message`` its words."""

    def __init__(self, message: str, code: str, status: Optional[int] = None) -> None:
        super().__init__(message)
        #: The server's message, saying what went wrong and what to do next.
        self.message = message
        #: The stable error code (``sandbox_not_found``, ...) or an SDK-side one (``connection_failed``).
        self.code = code
        #: The HTTP status, when the error came from an HTTP answer.
        self.status = status

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"


class NotFoundError(SandboxError):
    """The sandbox, command, file, key, tenant, secret or approval does not exist (or is another tenant's)."""


class InvalidArgumentError(SandboxError):
    """The request was refused as malformed or out of range; fix the arguments."""


class ConflictError(SandboxError):
    """The sandbox or file is in a state that does not allow this (not running, exists, changed, decided)."""


class TimeoutError(SandboxError):  # noqa: A001 - the SDK's own, as E2B's SDK names it
    """A request or command ran out of time."""


class RateLimitError(SandboxError):
    """The server is out of capacity or budget, or this tenant's quota is spent; retry later."""


class AuthenticationError(SandboxError):
    """The API key is missing, not accepted, or lacks the scope this call needs."""


class NotSupportedError(SandboxError):
    """This server or driver cannot do that (e.g. pause on gVisor)."""


class ServerError(SandboxError):
    """The server or the sandbox's agent failed; the message says what to try."""


class EgressError(SandboxError):
    """The egress gateway refused or could not reach a host."""


class ConnectionError(SandboxError):  # noqa: A001 - the SDK's own
    """The server could not be reached, or the connection broke mid-request."""


class CommandExitError(SandboxError):
    """A command ended with a non-zero exit code (or a signal); its result is kept on the error."""

    def __init__(
        self,
        command_id: str,
        exit_code: Optional[int],
        stdout: str,
        stderr: str,
        signal: Optional[str] = None,
    ) -> None:
        how = f"was ended by {signal or 'a signal'}" if exit_code is None else f"exited with code {exit_code}"
        tail = "\n".join(stderr.strip().split("\n")[-3:])
        super().__init__(f"Command {command_id} {how}" + (f": {tail}" if tail else ""), "command_exit")
        #: The command's id in the sandbox.
        self.command_id = command_id
        #: Its exit code; None when a signal ended it.
        self.exit_code = exit_code
        #: Everything it wrote to stdout (unless the run was asked not to keep output).
        self.stdout = stdout
        #: Everything it wrote to stderr.
        self.stderr = stderr
        #: The signal that ended it, e.g. ``SIGKILL``.
        self.signal = signal


class CommandTimeoutError(TimeoutError):
    """A command ran past its ``timeout`` and the server killed it; what it wrote is kept."""

    def __init__(self, command_id: str, stdout: str, stderr: str) -> None:
        super().__init__(f"Command {command_id} ran past its timeout and was killed.", "command_timeout")
        #: The command's id in the sandbox.
        self.command_id = command_id
        #: What it wrote to stdout before it was killed.
        self.stdout = stdout
        #: What it wrote to stderr before it was killed.
        self.stderr = stderr


#: Every code of the server's registry (packages/protocol/src/errors.ts) and the class it raises.
#: A unit test fails when the registry has a code this table lacks.
ERROR_CLASSES: Dict[str, Type[SandboxError]] = {
    "invalid_json": InvalidArgumentError,
    "invalid_request": InvalidArgumentError,
    "unsupported_media_type": InvalidArgumentError,
    "body_too_large": InvalidArgumentError,
    "invalid_url": InvalidArgumentError,
    "uri_too_long": InvalidArgumentError,
    "headers_too_large": InvalidArgumentError,
    "malformed_request": InvalidArgumentError,
    "request_timeout": TimeoutError,
    "expectation_failed": InvalidArgumentError,
    "invalid_template_name": InvalidArgumentError,
    "template_not_found": NotFoundError,
    "template_not_built": ConflictError,
    "invalid_template": ServerError,
    "template_build_failed": ServerError,
    "invalid_sandbox_id": InvalidArgumentError,
    "sandbox_not_found": NotFoundError,
    "sandbox_not_running": ConflictError,
    "sandbox_asleep": ConflictError,
    "idempotency_key_invalid": InvalidArgumentError,
    "idempotency_key_reused": ConflictError,
    "idempotency_key_in_flight": ConflictError,
    "invalid_command": InvalidArgumentError,
    "command_not_found": NotFoundError,
    "route_not_found": NotFoundError,
    "method_not_allowed": InvalidArgumentError,
    "upgrade_required": InvalidArgumentError,
    "capacity_exhausted": RateLimitError,
    "create_failed": ServerError,
    "agent_unavailable": ServerError,
    "agent_protocol_error": ServerError,
    "agent_timeout": TimeoutError,
    "file_not_found": NotFoundError,
    "file_error": InvalidArgumentError,
    "file_exists": ConflictError,
    "precondition_failed": ConflictError,
    "port_not_listening": ServerError,
    "desktop_not_available": ConflictError,
    "desktop_failed": ServerError,
    "conversation_not_found": NotFoundError,
    "turn_not_found": NotFoundError,
    "turn_ended": ConflictError,
    "export_not_found": NotFoundError,
    "document_not_found": NotFoundError,
    "not_supported": NotSupportedError,
    "unauthorized": AuthenticationError,
    "scope_missing": AuthenticationError,
    "host_not_allowed": AuthenticationError,
    "origin_refused": AuthenticationError,
    "csrf_token_invalid": AuthenticationError,
    "ui_not_built": NotFoundError,
    "allow_out_not_permitted": AuthenticationError,
    "quota_exceeded": RateLimitError,
    "key_not_found": NotFoundError,
    "tenant_not_found": NotFoundError,
    "tenant_exists": ConflictError,
    "tenant_in_use": ConflictError,
    "secret_not_found": NotFoundError,
    "secret_unknown": InvalidArgumentError,
    "secret_refused": AuthenticationError,
    "upstream_failed": ServerError,
    "approval_not_found": NotFoundError,
    "approval_not_pending": ConflictError,
    "shutting_down": RateLimitError,
    "lease_lost": RateLimitError,
    "forward_refused": AuthenticationError,
    "node_unreachable": ConnectionError,
    "node_not_found": NotFoundError,
    "internal": ServerError,
    "egress_denied": EgressError,
    "egress_unreachable": EgressError,
    "volume_not_found": NotFoundError,
    "volume_exists": ConflictError,
    "volume_in_use": ConflictError,
    "snapshot_not_found": NotFoundError,
    "snapshot_exists": ConflictError,
    "snapshot_in_use": ConflictError,
    "snapshot_memory_unsupported": NotSupportedError,
    "volume_share_unsafe": ConflictError,
    "invalid_volume_mount": InvalidArgumentError,
}

_BY_STATUS: Dict[int, Type[SandboxError]] = {
    400: InvalidArgumentError,
    401: AuthenticationError,
    403: AuthenticationError,
    404: NotFoundError,
    408: TimeoutError,
    409: ConflictError,
    412: ConflictError,
    413: InvalidArgumentError,
    422: InvalidArgumentError,
    429: RateLimitError,
    501: NotSupportedError,
    503: RateLimitError,
    504: TimeoutError,
}


def error_from_code(code: str, message: str, status: Optional[int] = None) -> SandboxError:
    """The typed error for a server error ``code`` (from a problem+json body or a WebSocket ``error`` frame)."""
    cls = ERROR_CLASSES.get(code)
    if cls is None and status is not None:
        cls = _BY_STATUS.get(status, ServerError if status >= 500 else SandboxError)
    return (cls or SandboxError)(message, code, status)


def error_from_problem(status: int, body: str) -> SandboxError:
    """Rebuilds the typed error from an HTTP error answer (RFC 9457 problem+json, or anything else)."""
    code = f"http_{status}"
    message = body.strip()[:500] or f"HTTP {status}"
    try:
        problem = json.loads(body)
    except ValueError:
        # Not JSON (a proxy's HTML page, say): the status and the body's start are all there is.
        problem = None
    if isinstance(problem, dict):
        if isinstance(problem.get("code"), str):
            code = problem["code"]
        if isinstance(problem.get("detail"), str):
            message = problem["detail"]
        elif isinstance(problem.get("title"), str):
            message = problem["title"]
    return error_from_code(code, message, status)
