"""The desktop calls. In a sandbox of another template they are refused as ConflictError
(desktop_not_available), which is cheap and always runs. The real screen needs a sandbox of the
``desktop`` template (Xvfb and Chromium: about a minute and 1 GiB on a 2-core machine), so that
test runs only with BOTHY_TEST_DESKTOP=1, to keep the suite inside CI's time budget."""

from __future__ import annotations

import os

import pytest

from bothy import ConflictError, Sandbox


def test_a_sandbox_without_a_desktop_refuses_desktop_calls(sandbox: Sandbox) -> None:
    with pytest.raises(ConflictError) as refused:
        sandbox.desktop.screenshot()
    assert refused.value.code == "desktop_not_available" and "desktop" in refused.value.message
    with pytest.raises(ConflictError):
        sandbox.desktop.click(10, 10)


@pytest.mark.skipif(os.environ.get("BOTHY_TEST_DESKTOP") != "1", reason="set BOTHY_TEST_DESKTOP=1 (boots the desktop template)")
def test_screenshot_mouse_keyboard_and_viewer_link() -> None:
    with Sandbox.create("desktop", vcpu=2, memory_mib=1024, timeout=600) as desk:
        info = desk.desktop.start(width=800, height=600)
        assert (info["width"], info["height"]) == (800, 600)
        shot = desk.desktop.screenshot()
        assert shot.png.startswith(b"\x89PNG\r\n\x1a\n") and (shot.width, shot.height) == (800, 600)
        assert desk.desktop.move(100, 120)["action"] == "move"
        assert desk.desktop.click(100, 120, button="left", count=2)["action"] == "click"
        assert desk.desktop.type("hello from python")["action"] == "type"
        assert desk.desktop.key("ctrl+a BackSpace")["action"] == "key"
        assert desk.desktop.scroll(400, 300, "down", 3)["action"] == "scroll"
        assert desk.desktop.viewer_url().endswith(f"/sandboxes/{desk.sandbox_id}/desktop")
        link = desk.desktop.viewer_link(ttl=120)
        assert link["url"] and link["expires_at"]
