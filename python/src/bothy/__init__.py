"""bothy for Python: sandboxes for AI agents on your own server.

``Sandbox`` (sync) and ``AsyncSandbox`` (async) create, connect, list and kill sandboxes and run
commands, terminals, files, ports and the desktop inside them; ``Approvals``, ``Secrets``,
``TenantPolicy``, ``Volumes``, ``Snapshots``, ``ApiKeys`` and ``Tenants`` (and their ``Async`` twins) are the tenant's and the
admin's side. The server's address and key come from arguments or BOTHY_URL / BOTHY_API_KEY.
"""

from ._admin_async import (
    AsyncApiKeys,
    AsyncApprovals,
    AsyncSecrets,
    AsyncSnapshots,
    AsyncTenantPolicy,
    AsyncTenants,
    AsyncVolumes,
)
from ._commands_async import AsyncCommandHandle, AsyncCommands, AsyncPty, CommandResult
from ._files_async import AsyncFiles
from ._sandbox_async import AsyncDesktop, AsyncPorts, AsyncSandbox
from .admin import ApiKeys, Approvals, Secrets, Snapshots, TenantPolicy, Tenants, Volumes
from .errors import (
    AuthenticationError,
    CommandExitError,
    CommandTimeoutError,
    ConflictError,
    ConnectionError,
    EgressError,
    InvalidArgumentError,
    NotFoundError,
    NotSupportedError,
    RateLimitError,
    SandboxError,
    ServerError,
    TimeoutError,
)
from ._forward import AsyncPortForward
from .sandbox import CommandHandle, Commands, Desktop, Files, PortForward, Ports, Pty, Sandbox
from .types import EntryInfo, Screenshot, SnapshotInfo, VolumeInfo, WriteInfo

__version__ = "0.1.0"

__all__ = [
    "ApiKeys",
    "Approvals",
    "AsyncApiKeys",
    "AsyncApprovals",
    "AsyncCommandHandle",
    "AsyncCommands",
    "AsyncDesktop",
    "AsyncFiles",
    "AsyncPortForward",
    "AsyncPorts",
    "AsyncPty",
    "AsyncSandbox",
    "AsyncSecrets",
    "AsyncSnapshots",
    "AsyncTenantPolicy",
    "AsyncTenants",
    "AsyncVolumes",
    "AuthenticationError",
    "CommandExitError",
    "CommandHandle",
    "CommandResult",
    "CommandTimeoutError",
    "Commands",
    "ConflictError",
    "ConnectionError",
    "Desktop",
    "EgressError",
    "EntryInfo",
    "Files",
    "InvalidArgumentError",
    "NotFoundError",
    "NotSupportedError",
    "PortForward",
    "Ports",
    "Pty",
    "RateLimitError",
    "Sandbox",
    "SandboxError",
    "Screenshot",
    "Secrets",
    "ServerError",
    "SnapshotInfo",
    "Snapshots",
    "TenantPolicy",
    "Tenants",
    "TimeoutError",
    "VolumeInfo",
    "Volumes",
    "WriteInfo",
]
