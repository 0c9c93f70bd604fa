"""The tenant's and the admin's side: keys, tenants, the tenant policy, secrets (write-only) and
approvals; and the errors a narrow, bad or foreign key meets, raised as the right classes."""

from __future__ import annotations

import json
import secrets as pysecrets

import pytest

from bothy._http import AsyncHttp, ConnectionConfig

from bothy import (
    ApiKeys,
    Approvals,
    AsyncApiKeys,
    AsyncApprovals,
    AsyncSandbox,
    AsyncSecrets,
    AsyncTenantPolicy,
    AsyncTenants,
    AuthenticationError,
    NotFoundError,
    Sandbox,
    Secrets,
    TenantPolicy,
    Tenants,
)

UNKNOWN_SANDBOX = "sbx_aaaaaaaaaaaaaaaaaaaa"
UNKNOWN_APPROVAL = "apr_aaaaaaaaaaaaaaaaaaaa"


@pytest.fixture(scope="module")
def tenant_b() -> str:
    """A second tenant and a key of it with the default scopes (all but keys:manage and admin)."""
    name = f"py{pysecrets.token_hex(3)}"
    with Tenants() as tenants:
        created = tenants.create(name, {"max_sandboxes": 2})
        assert created["tenant"] == name and created["quota"]["max_sandboxes"] == 2
        assert name in [t["tenant"] for t in tenants.list()]
        assert tenants.set_quota(name, {"max_sandboxes": None})["quota"].get("max_sandboxes") is None
    with ApiKeys() as keys:
        return keys.create(name="b", tenant=name)["key"]


def test_a_bad_key_is_an_authentication_error(sandbox: Sandbox) -> None:
    bad = "bothy_" + "0" * 64
    with pytest.raises(AuthenticationError) as raised:
        Sandbox.list(api_key=bad)
    assert raised.value.code == "unauthorized" and raised.value.status == 401 and raised.value.message
    with pytest.raises(AuthenticationError):
        Sandbox.connect(sandbox.sandbox_id, api_key=bad)


def test_another_tenants_sandbox_is_not_found(sandbox: Sandbox, tenant_b: str) -> None:
    """A key of tenant b sees tenant default's sandbox exactly as one that does not exist."""
    with pytest.raises(NotFoundError) as theirs:
        Sandbox.connect(sandbox.sandbox_id, api_key=tenant_b)
    with pytest.raises(NotFoundError) as nobodys:
        Sandbox.connect(UNKNOWN_SANDBOX, api_key=tenant_b)
    assert theirs.value.code == nobodys.value.code == "sandbox_not_found"
    assert sandbox.sandbox_id not in [s["sandbox_id"] for s in Sandbox.list(api_key=tenant_b)]
    assert Sandbox.kill(sandbox.sandbox_id, api_key=tenant_b) is False
    assert sandbox.is_running()


async def test_another_tenants_sandbox_refuses_commands_async(sandbox: Sandbox, tenant_b: str) -> None:
    # A handle on tenant default's sandbox that holds tenant b's key, as a client that learnt the
    # id would build one: every call is refused as not found.
    info = (await AsyncSandbox.connect(sandbox.sandbox_id)).info
    mine = AsyncSandbox(AsyncHttp(ConnectionConfig(api_key=tenant_b)), info)
    try:
        with pytest.raises(NotFoundError):
            await mine.commands.run("echo should not run")
        with pytest.raises(NotFoundError):
            await mine.files.read("/etc/hostname")
        with pytest.raises(NotFoundError):
            await mine.commands.exec("echo should not run")
        with pytest.raises(NotFoundError):
            await mine.ports.link(8000)
    finally:
        await mine.close()


def test_keys_minted_listed_and_revoked() -> None:
    with ApiKeys() as keys:
        made = keys.create(name="short-lived", scopes=["sandboxes:read"], expires_in=600)
        assert made["key"].startswith("bothy_") and made["scopes"] == ["sandboxes:read"]
        assert made["key_id"] in [k["key_id"] for k in keys.list()]
        assert isinstance(Sandbox.list(api_key=made["key"]), list)
        with pytest.raises(AuthenticationError) as narrow:
            Sandbox.create(api_key=made["key"])
        assert narrow.value.code == "scope_missing"
        assert keys.revoke(made["key_id"])["revoked_at"]
        with pytest.raises(AuthenticationError):
            Sandbox.list(api_key=made["key"])


async def test_keys_and_tenants_async() -> None:
    async with AsyncApiKeys() as keys:
        assert any(k["scopes"] for k in await keys.list())
    async with AsyncTenants() as tenants:
        assert "default" in [t["tenant"] for t in await tenants.list()]


def test_tenant_policy_set_get_clear() -> None:
    with TenantPolicy() as policy:
        assert policy.set({"deny_hosts": ["blocked.example.test"]})["policy"]["deny_hosts"] == [
            "blocked.example.test"
        ]
        assert policy.get()["policy"]["deny_hosts"] == ["blocked.example.test"]
        assert policy.clear()["policy"] is None


async def test_tenant_policy_async() -> None:
    async with AsyncTenantPolicy() as policy:
        assert (await policy.get())["tenant"] == "default"


def test_secrets_are_write_only() -> None:
    value = "sk-test-" + pysecrets.token_hex(12)
    with Secrets() as vault:
        put = vault.put("py_token", value, hosts=["api.example.test"], inject={"header": "authorization", "format": "Bearer {value}"})
        listed = vault.list()
        got = vault.get("py_token")
        assert put["hosts"] == ["api.example.test"] and got["name"] == "py_token"
        for answer in (put, listed, got):
            assert value not in json.dumps(answer)
        assert vault.delete("py_token")["name"] == "py_token"
        with pytest.raises(NotFoundError) as gone:
            vault.get("py_token")
        assert gone.value.code == "secret_not_found"


async def test_secrets_async() -> None:
    async with AsyncSecrets() as vault:
        await vault.put("py_async", "v-" + pysecrets.token_hex(8), hosts=["x.example.test"])
        assert "py_async" in [s["name"] for s in await vault.list()]
        await vault.delete("py_async")


def test_approvals_list_and_unknown_ids() -> None:
    with Approvals() as approvals:
        assert isinstance(approvals.list(state="pending"), list)
        with pytest.raises(NotFoundError) as unknown:
            approvals.approve(UNKNOWN_APPROVAL)
        assert unknown.value.code == "approval_not_found"


async def test_approvals_async_unknown() -> None:
    async with AsyncApprovals() as approvals:
        with pytest.raises(NotFoundError):
            await approvals.deny(UNKNOWN_APPROVAL, reason="no")
