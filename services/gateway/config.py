"""Gateway settings: flags `--stt-address ...` or env `KAME_GATEWAY_STT_ADDRESS ...`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kame_common.config import load_config, setting

MODES = ("tandem", "cascade", "s2s")


@dataclass
class GatewayConfig:
    host: str = setting("0.0.0.0", "interface the Converse API listens on")
    port: int = setting(50051, "gRPC port of the Converse API")
    metrics_port: int = setting(9101, "Prometheus /metrics port (0 disables)")
    max_sessions: int = setting(
        64, "open Converse sessions before RESOURCE_EXHAUSTED (0 = no limit)"
    )
    grace_s: float = setting(30.0, "on SIGTERM, seconds open sessions get to finish")
    otlp_endpoint: str = setting("", "OpenTelemetry OTLP/gRPC endpoint (empty = no export)")
    redis_url: str = setting("redis://127.0.0.1:6379/0", "session records and frontend registry")
    session_ttl_s: int = setting(3600, "Redis TTL of session records and conversations")
    stt_address: str = setting("127.0.0.1:50053", "host:port of the stt service")
    oracle_address: str = setting("127.0.0.1:50054", "host:port of the oracle service")
    frontend_address: str = setting(
        "127.0.0.1:50052",
        "host:port of the frontend used when the Redis capacity registry lists no replica",
    )
    default_mode: str = setting("tandem", "mode of sessions whose config leaves it unset", MODES)
    s2s_engine: str = setting("moshi", "frontend engine requested for s2s sessions")
    auth_token: str = setting("", "token clients must send in the config (empty = no auth)")
    max_session_s: float = setting(3600.0, "caller audio a session may stream (OUT_OF_RANGE after)")
    queue_frames: int = setting(
        25, "bound of each per-session queue, in messages (25 frames = 2 s of audio)"
    )
    connect_timeout_s: float = setting(
        10.0, "seconds to open upstream streams (frontend ready) at session start"
    )
    drain_timeout_s: float = setting(
        15.0, "after the caller half-closes, seconds upstreams get to finish their output"
    )
    turn_end_silence_s: float = setting(0.0, "tts engine pause that ends a turn (0 = its default)")
    filler_text: str = setting("", "tts engine: said at turn end when no oracle text is ready")


def load(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> GatewayConfig:
    return load_config(GatewayConfig, prefix="KAME_GATEWAY_", argv=argv, env=env)
