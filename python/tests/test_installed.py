"""The suite runs against the installed package, not the repository's source (the vitest wrapper
installs the wheel into a fresh venv and names it in BOTHY_EXPECT_SDK_UNDER)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import bothy


def test_the_installed_package_is_the_one_under_test() -> None:
    expected = os.environ.get("BOTHY_EXPECT_SDK_UNDER")
    if not expected:
        pytest.skip("run by hand: no installed package to check (BOTHY_EXPECT_SDK_UNDER)")
    location = Path(bothy.__file__).resolve()
    assert str(location).startswith(str(Path(expected).resolve())), location
    # PEP 561: the typing marker ships with it.
    assert (location.parent / "py.typed").exists()


def test_every_public_name_has_a_docstring() -> None:
    missing = []
    for name in bothy.__all__:
        obj = getattr(bothy, name)
        if not (obj.__doc__ or "").strip():
            missing.append(name)
        for attr, member in vars(obj).items() if isinstance(obj, type) else []:
            if attr.startswith("_") or not callable(member) and not isinstance(member, property):
                continue
            if not (getattr(member, "__doc__", None) or "").strip():
                missing.append(f"{name}.{attr}")
    assert missing == []
