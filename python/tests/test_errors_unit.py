"""The error table against the server's registry (no server needed): every code of
packages/protocol/src/errors.ts has a Python class, and problem+json answers become them."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from bothy import errors


def _registry() -> list:
    path = os.environ.get("BOTHY_PROTOCOL_ERRORS_TS") or str(
        Path(__file__).resolve().parents[2] / "packages" / "protocol" / "src" / "errors.ts"
    )
    if not Path(path).exists():
        pytest.skip(f"needs the protocol's errors.ts (set BOTHY_PROTOCOL_ERRORS_TS); not at {path}")
    source = Path(path).read_text("utf-8")
    block = re.search(r"ERROR_CODES = \[(.*?)\] as const", source, re.S)
    assert block, "ERROR_CODES not found in errors.ts"
    return re.findall(r'"([a-z0-9_]+)"', block.group(1))


def test_every_protocol_code_has_a_class() -> None:
    codes = _registry()
    assert len(codes) > 40
    missing = [c for c in codes if c not in errors.ERROR_CLASSES]
    assert missing == [], f"add these codes to bothy.errors.ERROR_CLASSES: {missing}"
    stale = [c for c in errors.ERROR_CLASSES if c not in codes]
    assert stale == [], f"codes the server no longer has: {stale}"


def test_problem_json_becomes_the_class_with_the_servers_message() -> None:
    err = errors.error_from_problem(
        404, '{"type":"about:blank","title":"Sandbox not found","status":404,"code":"sandbox_not_found","detail":"No sandbox x; list them."}'
    )
    assert isinstance(err, errors.NotFoundError)
    assert (err.code, err.status, err.message) == ("sandbox_not_found", 404, "No sandbox x; list them.")
    auth = errors.error_from_problem(401, '{"code":"unauthorized","detail":"Send a key."}')
    assert isinstance(auth, errors.AuthenticationError)


def test_unknown_codes_and_non_json_fall_back_to_the_status() -> None:
    newer = errors.error_from_problem(409, '{"code":"brand_new_code","detail":"later"}')
    assert type(newer) is errors.ConflictError and newer.code == "brand_new_code"
    html = errors.error_from_problem(502, "<html>bad gateway</html>")
    assert isinstance(html, errors.ServerError) and html.code == "http_502"
