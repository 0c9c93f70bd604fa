"""The tenant's side of the API (async): approvals, the secrets vault, volumes, the tenant's host
policy, and API keys and tenants for admins. Each class is made with the server's address and a key
(arguments, else BOTHY_URL / BOTHY_API_KEY) and closed with ``close()`` or ``async with``."""

from __future__ import annotations

from typing import Any, AsyncIterator, Dict, List, Optional, Set

from ._events import open_events, read_events
from ._http import AsyncHttp, ConnectionConfig
from .types import (
    ApiKeyInfo,
    ApprovalInfo,
    CreatedKey,
    SecretInfo,
    SnapshotInfo,
    TenantInfo,
    TenantPolicyInfo,
    VolumeInfo,
)


def _quote(part: str) -> str:
    from urllib.parse import quote

    return quote(part, safe="")


class _AsyncAdminBase:
    def __init__(
        self, *, base_url: Optional[str] = None, api_key: Optional[str] = None, request_timeout: Optional[float] = None
    ) -> None:
        self._http = AsyncHttp(ConnectionConfig(base_url, api_key, request_timeout))

    async def close(self) -> None:
        """Closes the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncApprovals(_AsyncAdminBase):
    """What ``ask`` rules hold until a person decides (scope ``approvals:decide``)."""

    async def list(
        self, *, state: Optional[str] = None, sandbox_id: Optional[str] = None, limit: Optional[int] = None
    ) -> List[ApprovalInfo]:
        """Newest first: the key's tenant's (every tenant's for an admin key)."""
        query = {"state": state, "sandbox_id": sandbox_id, "limit": limit}
        return (await self._http.json("GET", "/approvals", query=query))["approvals"]  # type: ignore[no-any-return]

    async def get(self, approval_id: str) -> ApprovalInfo:
        """One approval by id (NotFoundError when it is not this tenant's)."""
        return await self._http.json("GET", f"/approvals/{_quote(approval_id)}")  # type: ignore[no-any-return]

    async def approve(
        self, approval_id: str, *, host_minutes: Optional[int] = None, reason: Optional[str] = None
    ) -> ApprovalInfo:
        """Lets the held request out once (``host_minutes``: and the sandbox's requests to the same host
        for that long). A decided approval raises ConflictError (``approval_not_pending``)."""
        body: Dict[str, Any] = {"grant": "once"} if host_minutes is None else {"grant": "host", "minutes": host_minutes}
        if reason is not None:
            body["reason"] = reason
        return await self._http.json("POST", f"/approvals/{_quote(approval_id)}/approve", json_body=body)  # type: ignore[no-any-return]

    async def deny(self, approval_id: str, *, reason: Optional[str] = None) -> ApprovalInfo:
        """Refuses the held request; ``reason`` is shown to the one that asked."""
        body = {} if reason is None else {"reason": reason}
        return await self._http.json("POST", f"/approvals/{_quote(approval_id)}/deny", json_body=body)  # type: ignore[no-any-return]

    async def watch(self, *, sandbox_id: Optional[str] = None) -> AsyncIterator[ApprovalInfo]:
        """Yields each pending approval once: those pending now, then each new one as it is asked,
        until you stop iterating. The event stream opens first, so none asked meanwhile is missed."""
        res = await open_events(self._http, sandbox_id=sandbox_id)
        events = read_events(res)
        try:
            seen: Set[str] = set()
            for pending in reversed(await self.list(state="pending", sandbox_id=sandbox_id)):
                seen.add(pending["approval_id"])
                yield pending
            async for event in events:
                info: Any = event.get("data", {})
                if event.get("type") != "approval.requested" or info.get("approval_id") in seen:
                    continue
                seen.add(info["approval_id"])
                yield info
        finally:
            await events.aclose()
            await res.aclose()


class AsyncSecrets(_AsyncAdminBase):
    """The tenant's secrets vault (scope ``secrets``). Write-only: no call ever returns a value."""

    def _path(self, name: Optional[str], tenant: Optional[str]) -> str:
        path = "/secrets" if name is None else f"/secrets/{_quote(name)}"
        return path if tenant is None else f"{path}?tenant={_quote(tenant)}"

    async def put(
        self,
        name: str,
        value: str,
        *,
        hosts: List[str],
        inject: Optional[Dict[str, str]] = None,
        tenant: Optional[str] = None,
    ) -> SecretInfo:
        """Stores (or replaces) a secret that is only ever sent to ``hosts``; ``inject``:
        ``{"header": "Authorization", "format": "Bearer {value}"}`` sets that header on their requests."""
        body: Dict[str, Any] = {"value": value, "hosts": hosts}
        if inject is not None:
            body["inject"] = inject
        return await self._http.json("PUT", self._path(name, tenant), json_body=body)  # type: ignore[no-any-return]

    async def list(self, *, tenant: Optional[str] = None) -> List[SecretInfo]:
        """The tenant's secrets, without values."""
        return (await self._http.json("GET", self._path(None, tenant)))["secrets"]  # type: ignore[no-any-return]

    async def get(self, name: str, *, tenant: Optional[str] = None) -> SecretInfo:
        """One secret, without its value."""
        return await self._http.json("GET", self._path(name, tenant))  # type: ignore[no-any-return]

    async def delete(self, name: str, *, tenant: Optional[str] = None) -> SecretInfo:
        """Removes it; sandboxes bound to it keep a placeholder the gateway sends nowhere."""
        return await self._http.json("DELETE", self._path(name, tenant))  # type: ignore[no-any-return]


class AsyncTenantPolicy(_AsyncAdminBase):
    """The tenant's default host policy: rules every sandbox's requests meet before its own."""

    def _path(self, tenant: Optional[str]) -> str:
        return "/policy" if tenant is None else f"/policy?tenant={_quote(tenant)}"

    async def get(self, *, tenant: Optional[str] = None) -> TenantPolicyInfo:
        """The policy in force (``policy`` is None when there is none)."""
        return await self._http.json("GET", self._path(tenant))  # type: ignore[no-any-return]

    async def set(self, policy: Dict[str, Any], *, tenant: Optional[str] = None) -> TenantPolicyInfo:
        """Replaces it (scope ``policy``); wire names: ``allow_hosts``, ``deny_hosts``, ``rules``, ``default``."""
        return await self._http.json("PUT", self._path(tenant), json_body=policy)  # type: ignore[no-any-return]

    async def clear(self, *, tenant: Optional[str] = None) -> TenantPolicyInfo:
        """Removes it."""
        return await self._http.json("DELETE", self._path(tenant))  # type: ignore[no-any-return]


class AsyncApiKeys(_AsyncAdminBase):
    """API keys (scope ``keys:manage``; a key mints only within its own scopes)."""

    async def create(
        self,
        *,
        name: Optional[str] = None,
        scopes: Optional[List[str]] = None,
        tenant: Optional[str] = None,
        expires_in: Optional[int] = None,
    ) -> CreatedKey:
        """Makes a key; the answer's ``key`` is the only time it is shown."""
        fields = {"name": name, "scopes": scopes, "tenant": tenant, "expires_in_s": expires_in}
        return await self._http.json("POST", "/keys", json_body={k: v for k, v in fields.items() if v is not None})  # type: ignore[no-any-return]

    async def list(self) -> List[ApiKeyInfo]:
        """The keys this key may see."""
        return (await self._http.json("GET", "/keys"))["keys"]  # type: ignore[no-any-return]

    async def revoke(self, key_id: str) -> ApiKeyInfo:
        """Revokes a key by id: refused from its next request on."""
        return await self._http.json("DELETE", f"/keys/{_quote(key_id)}")  # type: ignore[no-any-return]


class AsyncTenants(_AsyncAdminBase):
    """Tenants and their quotas (scope ``admin``)."""

    async def create(self, tenant: str, quota: Optional[Dict[str, Any]] = None) -> TenantInfo:
        """Makes a tenant with optional quotas (``max_sandboxes``, ``max_vcpu``, ...)."""
        return await self._http.json("POST", "/tenants", json_body={"tenant": tenant, "quota": quota or {}})  # type: ignore[no-any-return]

    async def list(self) -> List[TenantInfo]:
        """Every tenant with its quotas and what it runs now."""
        return (await self._http.json("GET", "/tenants"))["tenants"]  # type: ignore[no-any-return]

    async def set_quota(self, tenant: str, quota: Dict[str, Any]) -> TenantInfo:
        """Sets the quotas named; None lifts one."""
        return await self._http.json("PATCH", f"/tenants/{_quote(tenant)}/quota", json_body=quota)  # type: ignore[no-any-return]


class AsyncVolumes(_AsyncAdminBase):
    """The tenant's volumes (scopes ``sandboxes:read`` / ``sandboxes:write``): ext4 disks that outlive
    every sandbox, mounted at create with ``volumes=[{"name", "path", "read_only"}]``. One sandbox
    writes a volume at a time, any number read it."""

    async def create(self, name: str, *, size_mib: int) -> VolumeInfo:
        """Makes an empty volume of ``size_mib`` (16 at least; ConflictError if the name is taken, RateLimitError
        past the tenant's storage quota). A full volume gives the guest ENOSPC."""
        body = {"name": name, "size_mib": size_mib}
        return await self._http.json("POST", "/volumes", json_body=body)  # type: ignore[no-any-return]

    async def list(self) -> List[VolumeInfo]:
        """The tenant's volumes, each with the live sandboxes that mount it."""
        return (await self._http.json("GET", "/volumes"))["volumes"]  # type: ignore[no-any-return]

    async def get(self, name: str) -> VolumeInfo:
        """One volume by name (NotFoundError when the tenant has none of that name)."""
        return await self._http.json("GET", f"/volumes/{_quote(name)}")  # type: ignore[no-any-return]

    async def delete(self, name: str) -> None:
        """Removes the volume and its data; ConflictError (``volume_in_use``) while a live sandbox
        mounts it."""
        await self._http.json("DELETE", f"/volumes/{_quote(name)}")


class AsyncSnapshots(_AsyncAdminBase):
    """The tenant's snapshots (scopes ``sandboxes:read`` / ``sandboxes:write``): a sandbox's files kept
    as a layer over its template's, taken with ``sandbox.snapshot()`` or ``sandbox.fork(n)`` and
    started from with ``Sandbox.create(snapshot=...)``. ``ref`` is an id (``snap_...``) or a name."""

    async def list(self) -> List[SnapshotInfo]:
        """The tenant's snapshots, each with the live sandboxes started from it."""
        return (await self._http.json("GET", "/snapshots"))["snapshots"]  # type: ignore[no-any-return]

    async def get(self, ref: str) -> SnapshotInfo:
        """One snapshot (NotFoundError when the tenant has none of that id or name)."""
        return await self._http.json("GET", f"/snapshots/{_quote(ref)}")  # type: ignore[no-any-return]

    async def delete(self, ref: str) -> None:
        """Removes it and its files; ConflictError (``snapshot_in_use``) while a live sandbox started from it."""
        await self._http.json("DELETE", f"/snapshots/{_quote(ref)}")
