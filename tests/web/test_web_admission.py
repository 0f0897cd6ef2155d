"""The web service's admission and idle rules against real attacks, over real
WebSockets on loopback before a real gateway (tests/gateway/fakes.py upstreams)
that takes one token:

- sockets without a token (and so without a call) lock no caller out, whatever
  the route, and each one lives no longer than start_timeout_s;
- one client address holds at most max_waiting_per_address such sockets; the
  address behind a trusted proxy is X-Forwarded-For's, anyone else's header is
  ignored;
- a caller who sends only silence and protocol chatter is closed at the idle
  timeout with the protocol's error, on /v1/realtime and on the page."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest
import websockets
from websockets.exceptions import InvalidStatus

from tests.support import wait_until
from tests.web.test_realtime import TOKEN, connect, web_service

SILENCE = bytes(2 * 2400)  # 100 ms of PCM16 at 24 kHz


def url(web, path: str) -> str:
    return f"ws://127.0.0.1:{web.port}{path}"


async def test_sockets_without_a_token_lock_no_caller_out(fakes):
    """At max_sessions=2: three Realtime sockets without a token that keep sending
    session.update, and Moshi sockets without one, leave a caller with a token served."""
    async with web_service(fakes, max_sessions=2) as web:
        squatters = [await websockets.connect(url(web, "/v1/realtime?model=kame-tandem"))]
        squatters += [await websockets.connect(url(web, "/v1/realtime?model=kame-tandem"))]
        squatters += [await websockets.connect(url(web, "/v1/realtime?model=kame-tandem"))]
        moshi = [await websockets.connect(url(web, "/api/chat")) for _ in range(2)]
        try:
            for squatter in squatters:
                assert json.loads(await squatter.recv())["type"] == "session.created"
                await squatter.send(json.dumps({"type": "session.update", "session": {}}))
            async with connect(web) as caller:
                first = await caller.recv()
                await caller.input_audio_buffer.append(audio=base64.b64encode(SILENCE).decode())
                await wait_until(lambda: web.web.admission.active == 1, "the caller's call", 10)
        finally:
            for socket in squatters + moshi:
                await socket.close()
    assert first.type == "session.created", first


async def test_a_socket_without_a_call_is_closed_at_start_timeout_s_whatever_it_sends(fakes):
    async with web_service(fakes, start_timeout_s=1.0) as web:
        squatter = await websockets.connect(url(web, "/v1/realtime?model=kame-tandem"))
        errors = []
        for _ in range(40):  # a session.update every 0.1 s: chatter, no call
            try:
                await squatter.send(json.dumps({"type": "session.update", "session": {}}))
                async with asyncio.timeout(0.1):
                    while True:
                        event = json.loads(await squatter.recv())
                        errors += [event["error"]] if event["type"] == "error" else []
            except TimeoutError:
                continue
            except websockets.ConnectionClosed:
                break
        assert squatter.close_code == 1008, "still open after 4 s"
    assert [e["code"] for e in errors] == ["session_start_timeout"], errors


async def test_one_address_holds_few_sockets_and_only_a_trusted_proxy_names_another(fakes):
    async with web_service(fakes, max_waiting_per_address=2, trusted_proxies="127.0.0.1") as web:
        path = url(web, "/v1/realtime?model=kame-tandem")
        held = [await websockets.connect(path) for _ in range(2)]
        with pytest.raises(InvalidStatus) as refused:
            await websockets.connect(url(web, "/api/chat"))
        behind = {"X-Forwarded-For": "203.0.113.7"}
        held += [await websockets.connect(path, additional_headers=behind) for _ in range(2)]
        with pytest.raises(InvalidStatus):
            await websockets.connect(path, additional_headers=behind)
        for socket in held:
            await socket.close()
    async with web_service(fakes, max_waiting_per_address=1) as web:  # no trusted proxy
        path = url(web, "/v1/realtime?model=kame-tandem")
        held = [await websockets.connect(path)]
        with pytest.raises(InvalidStatus):
            await websockets.connect(path, additional_headers={"X-Forwarded-For": "203.0.113.8"})
        await held[0].close()
    assert refused.value.response.status_code == 403


async def test_silence_and_chatter_do_not_keep_a_realtime_call_alive(fakes):
    async with web_service(fakes, realtime_idle_timeout_s=1.0) as web, connect(web) as caller:
        await caller.recv()  # session.created
        chat = [
            {"type": "input_audio_buffer.append", "audio": base64.b64encode(SILENCE).decode()},
            {"type": "session.update", "session": {"type": "realtime"}},
        ]
        idle = None
        for step in range(60):  # one message every 0.1 s, for up to 6 s
            await caller.send(chat[step % 2])
            try:
                async with asyncio.timeout(0.1):
                    while idle is None:
                        event = await caller.recv()
                        idle = event if event.type == "error" else None
            except TimeoutError:
                continue
            break
    assert idle is not None and idle.error.code == "idle_timeout", "a chatty silent call lives on"


async def test_a_page_streaming_silence_is_ended_at_the_idle_timeout(fakes):
    async with web_service(fakes, realtime_idle_timeout_s=1.0) as web:
        origin = {"Origin": f"http://127.0.0.1:{web.port}"}
        async with websockets.connect(url(web, "/converse"), additional_headers=origin) as page:
            start = {"type": "start", "mode": "tandem", "rate": 24000, "token": TOKEN}
            await page.send(json.dumps(start))
            events = []
            for _ in range(60):  # 100 ms of silence every 0.1 s, for up to 6 s
                try:
                    await page.send(SILENCE)
                    async with asyncio.timeout(0.1):
                        while True:
                            message = await page.recv()
                            if isinstance(message, str):
                                events.append(json.loads(message))
                except TimeoutError:
                    continue
                except websockets.ConnectionClosed:
                    break
    errors = [e for e in events if e["type"] == "error"]
    assert [e["code"] for e in errors] == ["DEADLINE_EXCEEDED"], events
    assert "no sound" in errors[0]["message"]


async def test_a_call_beyond_max_sessions_is_refused_once_it_started(fakes):
    async with web_service(fakes, max_sessions=1) as web:
        web.web.admission.active = 1  # one call is open
        origin = {"Origin": f"http://127.0.0.1:{web.port}"}
        async with websockets.connect(url(web, "/converse"), additional_headers=origin) as page:
            start = {"type": "start", "mode": "tandem", "rate": 24000, "token": TOKEN}
            await page.send(json.dumps(start))
            events = [json.loads(m) async for m in page if isinstance(m, str)]
        web.web.admission.active = 0
    error = events[-1]
    assert error["code"] == "RESOURCE_EXHAUSTED" and "limit of 1" in error["message"], events
