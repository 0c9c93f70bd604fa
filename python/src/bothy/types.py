"""The shapes the server answers, as typed dictionaries (wire names, as in the API and /openapi.json)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Optional, Any, Dict, List, Optional, TypedDict


class SandboxInfo(TypedDict, total=False):
    """A sandbox as ``GET /sandboxes/{id}`` answers it."""

    sandbox_id: str
    tenant: str
    metadata: Dict[str, str]
    state: str
    template: str
    driver: str
    acceleration: Optional[str]
    vcpu: int
    memory_mib: int
    disk_mib: Optional[int]
    max_processes: Optional[int]
    created_at: str
    deleted_at: Optional[str]
    expires_at: Optional[str]
    delete_on_disconnect: bool
    on_timeout: str
    auto_wake: bool
    network: Optional[Dict[str, Any]]
    policy: Optional[Dict[str, Any]]
    error: Optional[str]


class CommandInfo(TypedDict, total=False):
    """A command of a sandbox, running or recently finished."""

    command_id: str
    sandbox_id: str
    cmd: str
    state: str
    background: bool
    exit_code: Optional[int]
    signal: Optional[str]
    timed_out: bool
    started_at: str
    ended_at: Optional[str]


class ListeningPort(TypedDict, total=False):
    """A TCP port a server listens on inside the sandbox."""

    port: int
    address: str


class LinkInfo(TypedDict, total=False):
    """A signed link that works without an API key until ``expires_at``; share it like a key."""

    url: str
    expires_at: str
    preview_url: str


class ApprovalInfo(TypedDict, total=False):
    """A request (or tool call) an ``ask`` rule holds until a person decides."""

    approval_id: str
    tenant: str
    sandbox_id: str
    conversation_id: Optional[str]
    kind: str
    method: Optional[str]
    host: Optional[str]
    path: Optional[str]
    tool: Optional[str]
    excerpt: str
    rule: str
    state: str
    created_at: str
    expires_at: str
    decided_at: Optional[str]
    decided_by: Optional[str]
    grant: Optional[Dict[str, Any]]
    reason: Optional[str]


class SecretInfo(TypedDict, total=False):
    """A secret of the vault, described without its value."""

    name: str
    tenant: str
    hosts: List[str]
    inject: Optional[Dict[str, str]]
    created_at: str
    updated_at: str


class TenantPolicyInfo(TypedDict, total=False):
    """A tenant's default host policy."""

    tenant: str
    policy: Optional[Dict[str, Any]]


class ApiKeyInfo(TypedDict, total=False):
    """An API key, without its secret part."""

    key_id: str
    tenant: str
    name: str
    display: str
    scopes: List[str]
    created_at: str
    expires_at: Optional[str]
    revoked_at: Optional[str]
    last_used_at: Optional[str]


class CreatedKey(ApiKeyInfo, total=False):
    """A new key: ``key`` is the only time its secret is shown."""

    key: str


class VolumeMountInfo(TypedDict, total=False):
    """A live sandbox that mounts a volume, where, and whether read-only."""

    sandbox_id: str
    path: str
    read_only: bool


class VolumeInfo(TypedDict, total=False):
    """A volume: data that outlives every sandbox, mounted at create (``volumes=``)."""

    volume_id: str
    name: str
    size_mib: int
    created_at: str
    mounted_by: List[VolumeMountInfo]


class SnapshotInfo(TypedDict, total=False):
    """A snapshot: what a sandbox wrote over its template, that new sandboxes start from (``snapshot=``)."""

    snapshot_id: str
    name: Optional[str]
    source_sandbox_id: str
    template: str
    driver: str
    bytes: int
    created_at: str
    used_by: List[str]


class TenantInfo(TypedDict, total=False):
    """A tenant and its quotas."""

    tenant: str
    quota: Dict[str, Any]
    created_at: str
    live: Dict[str, int]


class BothyEvent(TypedDict, total=False):
    """One event of ``GET /events`` (``sandbox.created``, ``command.exited``, ``approval.requested``, ...)."""

    seq: int
    type: str
    sandbox_id: Optional[str]
    data: Dict[str, Any]
    created_at: str


class DesktopActionResult(TypedDict, total=False):
    """What a desktop action answers: the action and the screen's size."""

    action: str
    width: int
    height: int


class DesktopInfo(TypedDict, total=False):
    """A running desktop: its X display, screen size, ports and what this call started."""

    display: str
    width: int
    height: int
    vnc_port: int
    cdp_port: int
    started: List[str]


@dataclass
class EntryInfo:
    """A file or directory as ``files.list`` and ``files.stat`` describe it."""

    #: Its name (the last part of the path).
    name: str
    #: Its path inside the sandbox.
    path: str
    #: ``file``, ``dir``, ``symlink`` or ``other``.
    type: str
    #: Its size in bytes.
    size: int
    #: Permission bits, e.g. 0o644.
    mode: int
    #: When it was last modified.
    mtime: datetime
    #: With ``stat(..., sha256=True)``: the content hash of a regular file, for ``write(..., if_match=)``.
    sha256: Optional[str] = None


@dataclass
class WriteInfo:
    """What a write left: the path, its size and content hash."""

    #: The file's path inside the sandbox.
    path: str
    #: Its size in bytes.
    size: int
    #: Its sha256, hex.
    sha256: str


@dataclass
class Screenshot:
    """The desktop's screen as a PNG; action coordinates are its pixels."""

    #: The PNG file's bytes.
    png: bytes
    #: The screen's width in pixels.
    width: int
    #: The screen's height in pixels.
    height: int
