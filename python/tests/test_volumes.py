"""Volumes from Python: data one sandbox wrote is read by the next after the first is gone; a
volume a live sandbox mounts cannot be deleted; the async client lists and finds it."""

from __future__ import annotations

import secrets as pysecrets

import pytest

from bothy import AsyncVolumes, ConflictError, NotFoundError, Sandbox, Volumes


def test_a_volume_outlives_the_sandbox_that_wrote_it() -> None:
    name = f"py-{pysecrets.token_hex(4)}"
    with Volumes() as volumes:
        made = volumes.create(name, size_mib=16)
        assert made["name"] == name and made["size_mib"] == 16 and made["mounted_by"] == []
        try:
            writer = Sandbox.create("seed", volumes=[{"name": name, "path": "/data"}])
            try:
                assert writer.commands.run("echo kept > /data/note && sync").exit_code == 0
                assert volumes.get(name)["mounted_by"][0]["sandbox_id"] == writer.sandbox_id
            finally:
                writer.kill(wait=True)
            reader = Sandbox.create("seed", volumes=[{"name": name, "path": "/data", "read_only": True}])
            try:
                assert reader.commands.run("cat /data/note").stdout == "kept\n"
                with pytest.raises(ConflictError) as busy:
                    volumes.delete(name)
                assert busy.value.code == "volume_in_use"
            finally:
                reader.kill(wait=True)
        finally:
            volumes.delete(name)
        with pytest.raises(NotFoundError):
            volumes.get(name)


async def test_the_async_client_lists_and_finds_a_volume() -> None:
    name = f"py-{pysecrets.token_hex(4)}"
    async with AsyncVolumes() as volumes:
        await volumes.create(name, size_mib=16)
        try:
            assert name in [v["name"] for v in await volumes.list()]
            assert (await volumes.get(name))["size_mib"] == 16
        finally:
            await volumes.delete(name)
