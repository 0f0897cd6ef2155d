"""The web service under hostile callers without a token, black-box against
`kame up` (kame_cli/bench/web_abuse.py's run, issue #42): 64 idle sockets on
each WebSocket route leave a page caller with the token served; 16 sockets
sending 15 MiB messages on each route leave the web process under the chart's
256 Mi; a 400 KB function declaration is refused with a clear error at every
door. The LLM is a stub (nothing here asks it anything); the squatters come
from addresses of their own through X-Forwarded-For, which the web service
believes from loopback only because this stack says so (trusted_proxies).
One `kame up` (~30-60 s on a busy CPU)."""

from __future__ import annotations

import argparse
import re

from kame_cli.bench.web_abuse import CHART_LIMIT_MIB, abuse, print_report
from tests.e2e.kame_up import running
from tests.e2e.test_tools_stack import FAKE_LLM
from tests.support.llm import StubHttpServer

TOKEN = "web-abuse-token-7f3a9c2e51d84b06"
ABUSE_DB = 12  # the stack's own Redis database
ENV = {"KAME_GATEWAY_AUTH_TOKENS": TOKEN, "KAME_WEB_TRUSTED_PROXIES": "127.0.0.1"}
RUN = argparse.Namespace(sockets=64, big=16, big_mib=15, declaration_kb=400)


async def test_callers_without_a_token_take_nothing_from_the_web_service(tmp_path, redis_url):
    llm = StubHttpServer(FAKE_LLM)
    flags = ["--llm-base-url", await llm.start() + "/v1", "--llm-model", "stub-model"]
    try:
        async with running(flags, tmp_path / "logs", redis_url, ABUSE_DB, ENV) as stack:
            web = re.search(r"^\s+web\s+http://(127\.0\.0\.1:\d+)/", stack.printed, re.M)
            assert web, stack.printed
            report = await abuse(web.group(1), stack.address("gateway"), TOKEN, RUN)
    finally:
        await llm.close()
    print_report(report)

    assert report.page_served, report.page_first_event
    assert all(count > 0 for count in report.accepted.values()), report.accepted
    assert max(report.rss_squat_peak_mib, report.rss_peak_mib) < CHART_LIMIT_MIB, report
    assert all(codes == "1009" for codes in report.flood_closed.values()), report.flood_closed
    refusals = report.declaration_refusals
    assert set(refusals) == {"/v1/realtime", "/v1/live/sessions", "gRPC Converse"}
    # Each door refuses it naming its size (420 KB with the JSON around it) and the limit.
    assert all(re.search(r"\b4207\d\d\b", why) for why in refusals.values()), refusals
