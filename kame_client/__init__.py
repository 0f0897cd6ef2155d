"""The client of the KAME stack's gateway (`kame.v1.Gateway/Converse`),
importable and installable without the services: it needs only the generated
protos (kamepb) and kame_common.

- client.py: `ConverseClient`, one call (config, audio, requests, responses);
- events.py: the gateway's responses as typed events (`event_of`, the one
  mapping) and their JSON (`event_json`);
- status.py: how a call ended, as each edge says it (`CallEnd`: words, the
  retry-after hint, WebSocket close code, Realtime error type, SIP response);
- codecs.py: the audio codecs both the gateway and its clients use;
- microphone.py: caller audio at real time; caller.py + result.py: the paced
  WAV caller of `kame talk`, the benchmarks and the tests.
"""
