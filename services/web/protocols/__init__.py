"""The web service's protocols, side by side, each an adapter of the one bridge
(services/web/bridge.py), which owns the socket, the Converse call, pacing,
the tasks and the end:

- page.py: the browser page's own (WS /converse);
- realtime.py (+ realtime_*.py): OpenAI Realtime (WS /v1/realtime);
- moshi.py (+ moshi_audio.py, ogg_opus.py): kyutai's Moshi (WS /api/chat).

An adapter is sans-IO: it never touches the network, so its tests feed it
messages and events and read what it asks for. It implements
adapter.Adapter:

- `name` (for the log) and `idle_timeout_s` (None: the client may be silent);
- `opening()`: what to do before the client's first message: send a greeting
  (Realtime's session.created), open the call at once (OpenCall, with the
  coding to pace the caller's audio at, or None to send it as it comes);
- `on_client(message)`: one text (str) or binary (bytes) message of the
  client's;
- `on_event(event)`: one gateway event, a kame_client.events class to `match`;
- `on_call_end(end)`: the gateway ended the call (None: OK; else a
  kame_client.status.CallEnd, whose words, close code and error type are the
  one mapping of the gateway's status); the session ends after it;
- `on_backlog_full()`, `on_idle()`, `on_start_timeout(s)`, `on_fault()`:
  audio beyond the paced backlog, a caller with no sound and no text for
  `idle_timeout_s` (services/web/activity.py), a socket whose call has not
  started `start_timeout_s` after its handshake, a bug of ours (the bridge
  logs it): what the client is told.

Each returns Actions: messages to send (str: text frame), the call to open,
caller audio and CallerRequests for it, a timer to (dis)arm, and the Close
that ends the session. A protocol to add (say OpenAI's GPT-Live,
/v1/live/sessions) is one more adapter module here and one route in
server.py, not one more bridge.
"""
