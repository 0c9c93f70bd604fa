"""The tenant's side of the API, sync: approvals, secrets, volumes, the tenant policy, keys and tenants.
Thin wrappers over the async classes, run on the SDK's event loop thread."""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional

from . import _portal
from ._admin_async import (
    AsyncApiKeys,
    AsyncApprovals,
    AsyncSecrets,
    AsyncSnapshots,
    AsyncTenantPolicy,
    AsyncTenants,
    AsyncVolumes,
)
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


class _Sync:
    _async_cls: Any = None

    def __init__(
        self, *, base_url: Optional[str] = None, api_key: Optional[str] = None, request_timeout: Optional[float] = None
    ) -> None:
        """``base_url`` and ``api_key`` default to BOTHY_URL and BOTHY_API_KEY."""
        self._a = self._async_cls(base_url=base_url, api_key=api_key, request_timeout=request_timeout)

    def close(self) -> None:
        """Closes the connection pool."""
        _portal.call(self._a.close())

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Approvals(_Sync):
    """What ``ask`` rules hold until a person decides (scope ``approvals:decide``)."""

    _async_cls = AsyncApprovals

    def list(
        self, *, state: Optional[str] = None, sandbox_id: Optional[str] = None, limit: Optional[int] = None
    ) -> List[ApprovalInfo]:
        """Newest first: the key's tenant's (every tenant's for an admin key)."""
        return _portal.call(self._a.list(state=state, sandbox_id=sandbox_id, limit=limit))

    def get(self, approval_id: str) -> ApprovalInfo:
        """One approval by id."""
        return _portal.call(self._a.get(approval_id))

    def approve(
        self, approval_id: str, *, host_minutes: Optional[int] = None, reason: Optional[str] = None
    ) -> ApprovalInfo:
        """Lets the held request out once (``host_minutes``: the same host for that long too)."""
        return _portal.call(self._a.approve(approval_id, host_minutes=host_minutes, reason=reason))

    def deny(self, approval_id: str, *, reason: Optional[str] = None) -> ApprovalInfo:
        """Refuses the held request."""
        return _portal.call(self._a.deny(approval_id, reason=reason))

    def watch(self, *, sandbox_id: Optional[str] = None) -> Iterator[ApprovalInfo]:
        """Yields each pending approval once (those pending now, then new ones) while you iterate."""
        return _portal.iterate(self._a.watch(sandbox_id=sandbox_id))


class Secrets(_Sync):
    """The tenant's secrets vault (scope ``secrets``). Write-only: no call returns a value."""

    _async_cls = AsyncSecrets

    def put(
        self,
        name: str,
        value: str,
        *,
        hosts: List[str],
        inject: Optional[Dict[str, str]] = None,
        tenant: Optional[str] = None,
    ) -> SecretInfo:
        """Stores (or replaces) a secret that is only ever sent to ``hosts``."""
        return _portal.call(self._a.put(name, value, hosts=hosts, inject=inject, tenant=tenant))

    def list(self, *, tenant: Optional[str] = None) -> List[SecretInfo]:
        """The tenant's secrets, without values."""
        return _portal.call(self._a.list(tenant=tenant))

    def get(self, name: str, *, tenant: Optional[str] = None) -> SecretInfo:
        """One secret, without its value."""
        return _portal.call(self._a.get(name, tenant=tenant))

    def delete(self, name: str, *, tenant: Optional[str] = None) -> SecretInfo:
        """Removes it."""
        return _portal.call(self._a.delete(name, tenant=tenant))


class TenantPolicy(_Sync):
    """The tenant's default host policy."""

    _async_cls = AsyncTenantPolicy

    def get(self, *, tenant: Optional[str] = None) -> TenantPolicyInfo:
        """The policy in force."""
        return _portal.call(self._a.get(tenant=tenant))

    def set(self, policy: Dict[str, Any], *, tenant: Optional[str] = None) -> TenantPolicyInfo:
        """Replaces it (scope ``policy``)."""
        return _portal.call(self._a.set(policy, tenant=tenant))

    def clear(self, *, tenant: Optional[str] = None) -> TenantPolicyInfo:
        """Removes it."""
        return _portal.call(self._a.clear(tenant=tenant))


class ApiKeys(_Sync):
    """API keys (scope ``keys:manage``)."""

    _async_cls = AsyncApiKeys

    def create(
        self,
        *,
        name: Optional[str] = None,
        scopes: Optional[List[str]] = None,
        tenant: Optional[str] = None,
        expires_in: Optional[int] = None,
    ) -> CreatedKey:
        """Makes a key; the answer's ``key`` is the only time it is shown."""
        return _portal.call(self._a.create(name=name, scopes=scopes, tenant=tenant, expires_in=expires_in))

    def list(self) -> List[ApiKeyInfo]:
        """The keys this key may see."""
        return _portal.call(self._a.list())

    def revoke(self, key_id: str) -> ApiKeyInfo:
        """Revokes a key by id."""
        return _portal.call(self._a.revoke(key_id))


class Tenants(_Sync):
    """Tenants and quotas (scope ``admin``)."""

    _async_cls = AsyncTenants

    def create(self, tenant: str, quota: Optional[Dict[str, Any]] = None) -> TenantInfo:
        """Makes a tenant."""
        return _portal.call(self._a.create(tenant, quota))

    def list(self) -> List[TenantInfo]:
        """Every tenant."""
        return _portal.call(self._a.list())

    def set_quota(self, tenant: str, quota: Dict[str, Any]) -> TenantInfo:
        """Sets the quotas named; None lifts one."""
        return _portal.call(self._a.set_quota(tenant, quota))


class Volumes(_Sync):
    """The tenant's volumes: disks that outlive every sandbox, mounted at create with
    ``volumes=[{"name", "path", "read_only"}]``. One writer at a time, any number of readers."""

    _async_cls = AsyncVolumes

    def create(self, name: str, *, size_mib: int) -> VolumeInfo:
        """Makes an empty volume of ``size_mib``; a full one gives the guest ENOSPC."""
        return _portal.call(self._a.create(name, size_mib=size_mib))

    def list(self) -> List[VolumeInfo]:
        """The tenant's volumes, each with the live sandboxes that mount it."""
        return _portal.call(self._a.list())

    def get(self, name: str) -> VolumeInfo:
        """One volume by name."""
        return _portal.call(self._a.get(name))

    def delete(self, name: str) -> None:
        """Removes it and its data; ConflictError while a live sandbox mounts it."""
        _portal.call(self._a.delete(name))


class Snapshots(_Sync):
    """The tenant's snapshots: a sandbox's files kept as a layer over its template's, taken with
    ``sandbox.snapshot()`` or ``sandbox.fork(n)``, started from with ``Sandbox.create(snapshot=...)``."""

    _async_cls = AsyncSnapshots

    def list(self) -> List[SnapshotInfo]:
        """The tenant's snapshots, each with the live sandboxes started from it."""
        return _portal.call(self._a.list())

    def get(self, ref: str) -> SnapshotInfo:
        """One snapshot by id or name."""
        return _portal.call(self._a.get(ref))

    def delete(self, ref: str) -> None:
        """Removes it and its files; ConflictError while a live sandbox started from it."""
        _portal.call(self._a.delete(ref))
