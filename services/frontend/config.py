"""Frontend service settings: flags `--engine tts` or environment `KAME_FRONTEND_ENGINE=tts`."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kame_common.config import ConfigError, load_config, setting

ENV_PREFIX = "KAME_FRONTEND_"
ENGINES = ("tts", "kame", "moshi")


@dataclass
class FrontendSettings:
    host: str = setting("0.0.0.0", "Address the gRPC server binds")
    port: int = setting(50052, "gRPC port (0 picks a free one)")
    metrics_port: int = setting(9102, "Prometheus /metrics port (0 disables)")
    engine: str = setting("tts", "Engine this replica serves", choices=ENGINES)
    voice: str = setting("", "tts engine: piper .onnx voice path (empty = embedded joe voice)")
    checkpoint: str = setting("", "kame/moshi engines: checkpoint directory or HF repo id")
    device: str = setting("cpu", "kame/moshi engines: torch device")
    dtype: str = setting("float32", "kame/moshi engines: torch dtype")
    batch_slots: int = setting(
        4, "Sessions served at once (kame/moshi: the model's batch size; tts: concurrent voices)"
    )
    max_sessions: int = setting(0, "Admission limit on open streams (0 = batch_slots decides)")
    grace_s: float = setting(30.0, "On SIGTERM, seconds open sessions get to finish")
    otlp_endpoint: str = setting("", "OpenTelemetry OTLP/gRPC endpoint (empty = no export)")
    redis_url: str = setting("redis://127.0.0.1:6379/0", "Redis for the capacity registry")
    replica_id: str = setting("", "Name in the capacity registry (empty = hostname-pid)")
    advertise_address: str = setting(
        "", "host:port the gateway dials for this replica (empty = 127.0.0.1:<bound port>)"
    )

    def resolved_replica_id(self) -> str:
        return self.replica_id or f"{socket.gethostname()}-{os.getpid()}"

    def resolved_advertise_address(self, bound_port: int) -> str:
        return self.advertise_address or f"127.0.0.1:{bound_port}"


def load(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> FrontendSettings:
    settings = load_config(FrontendSettings, prefix=ENV_PREFIX, argv=argv, env=env)
    if settings.batch_slots < 1:
        raise ConfigError(f"batch_slots: must be at least 1, got {settings.batch_slots}")
    if settings.max_sessions < 0:
        raise ConfigError(f"max_sessions: must not be negative, got {settings.max_sessions}")
    return settings
