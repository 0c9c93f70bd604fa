"""Fixtures shared by the suite: the server from BOTHY_URL / BOTHY_API_KEY (the vitest wrapper
python-sdk.test.ts starts one and sets them) and ONE sandbox for the whole session, so the suite
boots as few sandboxes as it can."""

from __future__ import annotations

import os
import time
from typing import Callable, Iterator, TypeVar

import pytest

from bothy import Sandbox

T = TypeVar("T")

if not os.environ.get("BOTHY_URL") or not os.environ.get("BOTHY_API_KEY"):
    pytest.exit("set BOTHY_URL and BOTHY_API_KEY to a bothy server and its admin key", returncode=2)


def poll(check: Callable[[], T], what: str, deadline_s: float = 60.0) -> T:
    """Calls ``check`` until it answers something truthy, or fails naming ``what`` at the deadline."""
    end = time.monotonic() + deadline_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)  # the poll's pace, not a wait for an outcome


@pytest.fixture(scope="session")
def sandbox() -> Iterator[Sandbox]:
    """One sandbox for the session's sync and async tests; killed at the end."""
    with Sandbox.create("seed", timeout=900, metadata={"suite": "python-sdk"}) as sbx:
        print(f"session sandbox {sbx.sandbox_id}")
        yield sbx
