"""A request held by an ``ask`` rule of the egress gateway, seen through ``Approvals.watch`` and
decided from Python. Needs the server the vitest wrapper starts in its network lab, which names
the lab's test host and address (BOTHY_TEST_EGRESS_*); elsewhere it skips, saying so."""

from __future__ import annotations

import json
import os

import pytest

from bothy import Approvals, AsyncApprovals, ConflictError, Sandbox

HOST = os.environ.get("BOTHY_TEST_EGRESS_HOST")
OTHER = os.environ.get("BOTHY_TEST_EGRESS_OTHER_HOST")
ADDRESS = os.environ.get("BOTHY_TEST_EGRESS_ADDRESS")

pytestmark = pytest.mark.skipif(
    not (HOST and OTHER and ADDRESS),
    reason="needs the network lab's test hosts (BOTHY_TEST_EGRESS_HOST, _OTHER_HOST, _ADDRESS)",
)


def client(host: str, body: str) -> str:
    """A shell line that POSTs ``body`` to the lab's address as ``host`` from inside the sandbox
    (the template's Node) and prints the status and the answer."""
    script = (
        "const r = require('http').request({host: process.env.ADDR, port: 80, path: '/echo', method: 'POST',"
        " headers: {host: process.env.HOST}, timeout: 110000}, (res) => { let b = '';"
        " res.on('data', (d) => (b += d)); res.on('end', () => console.log(JSON.stringify({status: res.statusCode, body: b}))); });"
        " r.on('error', (e) => console.log(JSON.stringify({err: e.message}))); r.end(process.env.BODY);"
    )
    return f"HOST={host} ADDR={ADDRESS} BODY='{body}' node -e \"{script}\""


@pytest.fixture(scope="module")
def asking() -> Sandbox:
    """A sandbox whose requests to both test hosts wait for a person."""
    assert HOST and OTHER
    with Sandbox.create(
        "seed", timeout=600, policy={"rules": [{"host": HOST, "action": "ask"}, {"host": OTHER, "action": "ask"}]}
    ) as sbx:
        yield sbx  # type: ignore[misc]


def test_a_held_request_is_watched_and_approved_from_python(asking: Sandbox) -> None:
    sent = asking.commands.run(client(str(HOST), "deploy please"), background=True)
    with Approvals() as approvals:
        watch = approvals.watch(sandbox_id=asking.sandbox_id)
        try:
            held = next(watch)
        finally:
            watch.close()  # type: ignore[attr-defined]
        assert (held["kind"], held["host"], held["method"], held["excerpt"]) == ("http", HOST, "POST", "deploy please")
        assert held["state"] == "pending"
        decided = approvals.approve(held["approval_id"], reason="looks fine")
        assert decided["state"] == "approved" and decided["grant"]["kind"] == "once"
        with pytest.raises(ConflictError) as twice:
            approvals.deny(held["approval_id"])
        assert twice.value.code == "approval_not_pending"
    answer = json.loads(sent.wait().stdout)
    assert answer["status"] == 200, answer
    assert json.loads(answer["body"])["body"] == "deploy please"


async def test_a_held_request_is_denied_from_async_python(asking: Sandbox) -> None:
    sent = asking.commands.run(client(str(OTHER), "not this one"), background=True)
    async with AsyncApprovals() as approvals:
        watch = approvals.watch(sandbox_id=asking.sandbox_id)
        try:
            held = await watch.__anext__()
        finally:
            await watch.aclose()  # type: ignore[attr-defined]
        assert held["host"] == OTHER and held["state"] == "pending"
        assert (await approvals.deny(held["approval_id"], reason="not today"))["state"] == "denied"
    answer = json.loads(sent.wait().stdout)
    assert answer.get("status") != 200, answer
    kinds = [(e["type"], e["data"].get("outcome")) for e in asking.audit(types=["egress.asked", "egress.denied"])]
    assert ("egress.denied", "denied") in kinds
