"""`kame up` names the web service's endpoints for programs on a line each
(`realtime ws://...`, `live ws://...`, `moshi ws://...`), and each URL is one the web service
serves: the lines are built from the web page's URL, the routes are the web
app's own."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from kame_cli.up import api_lines
from services.web.config import WebSettings
from services.web.server import WebApp

WEB_URL = "http://127.0.0.1:8088/"


def test_kame_up_prints_the_realtime_live_and_moshi_urls_on_lines_of_their_own():
    printed = "\n".join(api_lines(WEB_URL))
    urls = dict(re.findall(r"^\s+(realtime|live|moshi)\s+(ws://\S+)", printed, re.M))
    assert urls == {
        "realtime": "ws://127.0.0.1:8088/v1/realtime",
        "live": "ws://127.0.0.1:8088/v1/live/sessions",
        "moshi": "ws://127.0.0.1:8088/api/chat",
    }
    assert "live      ws://127.0.0.1:8088/v1/live/sessions (OpenAI GPT-Live)" in printed
    served = {route.path for route in WebApp(WebSettings(metrics_port=0)).app.routes}
    assert {urlsplit(url).path for url in urls.values()} <= served


def test_an_https_page_gets_wss_endpoints():
    assert all(
        "wss://kame.example:8443/" in line for line in api_lines("https://kame.example:8443/")
    )
