"""Snapshots from Python: a sandbox's files kept and started from, a fork whose children see them,
a snapshot in use that cannot be deleted, and the async client's list."""

from __future__ import annotations

import secrets as pysecrets

import pytest

from bothy import AsyncSnapshots, ConflictError, NotFoundError, NotSupportedError, Sandbox, Snapshots


def test_a_snapshot_is_started_from_and_forked() -> None:
    name = f"py-{pysecrets.token_hex(4)}"
    source = Sandbox.create("seed")
    try:
        assert source.commands.run("echo kept > /root/note").exit_code == 0
        snap = source.snapshot(name=name)
        assert snap["name"] == name and snap["source_sandbox_id"] == source.sandbox_id
        with pytest.raises(NotSupportedError):
            source.snapshot(memory=True)
        child = Sandbox.create(snapshot=name)
        with Snapshots() as snapshots:
            try:
                assert child.commands.run("cat /root/note").stdout == "kept\n"
                with pytest.raises(ConflictError) as busy:
                    snapshots.delete(name)
                assert busy.value.code == "snapshot_in_use"
            finally:
                child.kill(wait=True)
            forked, children = source.fork(2)
            try:
                assert sorted(forked["used_by"]) == sorted(c.sandbox_id for c in children)
                assert [c.commands.run("cat /root/note").stdout for c in children] == ["kept\n", "kept\n"]
            finally:
                for c in children:
                    c.kill(wait=True)
            for ref in (name, forked["snapshot_id"]):
                snapshots.delete(ref)
            with pytest.raises(NotFoundError):
                snapshots.get(name)
    finally:
        source.kill(wait=True)


async def test_the_async_client_lists_snapshots() -> None:
    async with AsyncSnapshots() as snapshots:
        assert isinstance(await snapshots.list(), list)
