"""The page's errors in a real browser (Debian's Chromium, headless, driven by Playwright),
without the stack: a browser that gives the page no microphone, a gateway that does not
answer, and one that is busy. Each must end in an error the person can read, not in silence."""

from __future__ import annotations

import shutil

import pytest
from playwright.async_api import async_playwright

from services.web.config import WebSettings
from services.web.server import serve

CHROMIUM = shutil.which("chromium")
NOWHERE = "127.0.0.1:1"  # nothing listens on port 1
FAKE_MICROPHONE = ["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream"]

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")


@pytest.fixture
async def web():
    server = await web_in_front_of(NOWHERE)
    yield server
    await server.stop()


async def web_in_front_of(gateway_address: str):
    return await serve(
        WebSettings(host="127.0.0.1", port=0, metrics_port=0, gateway_address=gateway_address)
    )


async def error_shown(url: str, browser_args: list[str]) -> tuple[dict, str]:
    """Open the page, press Start, and return kameState (with the Start button's
    `startLabel` and `startDisabled`) and the error text once it has one."""
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=browser_args)
        try:
            page = await browser.new_page()
            await page.goto(url)
            await page.wait_for_function("() => document.querySelector('#mode').options.length")
            await page.click("#start")
            await page.wait_for_function("() => kameState.status === 'error'", timeout=30_000)
            state = await page.evaluate("() => JSON.parse(JSON.stringify(kameState))")
            start = page.locator("#start")
            state["startLabel"] = await start.inner_text()
            state["startDisabled"] = await start.is_disabled()
            return state, await page.inner_text("#error")
        finally:
            await browser.close()


async def test_no_microphone_is_said_in_words(web):
    # No fake UI: headless Chromium refuses the permission prompt nobody can answer.
    state, shown = await error_shown(web.url, ["--use-fake-device-for-media-stream"])
    assert shown.startswith("no microphone"), shown
    assert state["error"] == shown and not state["sessionId"]


async def test_a_gateway_that_does_not_answer_is_said_in_words(web):
    state, shown = await error_shown(web.url, FAKE_MICROPHONE)
    assert shown.startswith("gateway down: the web service gets no answer"), shown
    assert "127.0.0.1:1" not in shown  # no internal address on the page
    assert [e["code"] for e in state["events"] if e["type"] == "error"] == ["UNAVAILABLE"]


async def test_a_busy_stack_says_when_to_try_again_and_start_counts_down(busy_gateway):
    server = await web_in_front_of(busy_gateway)
    try:
        state, shown = await error_shown(server.url, FAKE_MICROPHONE)
    finally:
        await server.stop()
    assert shown.startswith("the agent is busy: try again in 3 s"), shown
    assert state["retryAfterS"] == 3
    assert state["startDisabled"] and state["startLabel"].startswith("Try again in"), state
