"""Gateway settings: flags `--stt-address ...` or env `KAME_GATEWAY_STT_ADDRESS ...`."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import ClassVar

from kame_common.auth import parse_tokens
from kame_common.config import (
    ConfigError,
    ServiceSettings,
    answer_time_factor_setting,
    check_answer_time_factor,
    check_not_negative,
    check_secret,
    check_token,
    redis_timeout_setting,
    setting,
)
from kame_common.hold import check_hold_max_s, split_hold_phrases
from kame_common.ports import LOCAL_REDIS_URL, loopback_address
from kame_common.tls import ClientTls

MODES = ("tandem", "cascade", "s2s")


@dataclass
class GatewaySettings(ServiceSettings):
    SERVICE: ClassVar[str] = "gateway"

    # The client-facing port shows callers no more of the API than they need.
    reflection: bool = setting(False, "serve gRPC reflection on the client port")
    auth_tokens: str = setting(
        "",
        "comma-separated bearer tokens callers may send as 'authorization: Bearer <token>' "
        "metadata (several at once for rotation; each of 16 characters and about 64 bits of "
        "randomness at least, e.g. openssl rand -hex 32; empty = no auth)",
    )
    published_on: str = setting(
        "",
        "the host address docker compose publishes the client port on (its KAME_BIND; empty "
        "= not published): one beyond loopback with neither auth_tokens nor "
        "tls_client_ca_file refuses to start, since anyone who reaches it could call",
    )
    upstream_ca_file: str = setting(
        "", "PEM CA of the frontend/stt/oracle server certificates (non-empty = TLS to upstreams)"
    )
    upstream_cert_file: str = setting(
        "", "PEM client certificate the gateway shows upstreams (mTLS; with upstream_key_file)"
    )
    upstream_key_file: str = setting("", "PEM private key of upstream_cert_file")
    upstream_server_name: str = setting(
        "", "name the upstream certificates must carry when addresses are IPs (empty = the host)"
    )
    registry_secret: str = setting(
        "",
        "HMAC key of the capacity registry (non-empty = use only records signed with it)",
    )
    capacity_admission: bool = setting(
        True,
        "refuse new calls (RESOURCE_EXHAUSTED, retry hint) while the stt or oracle replicas "
        "in the registry report no free capacity (none publishing = admit)",
    )
    answer_time_factor: float = answer_time_factor_setting()
    max_sessions: int = setting(
        64, "open Converse sessions before RESOURCE_EXHAUSTED (0 = no limit)"
    )
    redis_url: str = setting(LOCAL_REDIS_URL, "session records and the capacity registry")
    session_ttl_s: int = setting(3600, "Redis TTL of session records and conversations")
    stt_address: str = setting(loopback_address("stt"), "host:port of the stt service")
    oracle_address: str = setting(loopback_address("oracle"), "host:port of the oracle service")
    frontend_address: str = setting(
        loopback_address("frontend"),
        "host:port of the frontend used when the Redis capacity registry lists no replica",
    )
    default_mode: str = setting("tandem", "mode of sessions whose config leaves it unset", MODES)
    s2s_engine: str = setting("moshi", "frontend engine requested for s2s sessions")
    max_session_s: float = setting(
        3600.0,
        "longest call, in caller audio and in wall-clock time from its start, whatever the "
        "caller sends (OUT_OF_RANGE after)",
    )
    queue_frames: int = setting(
        25, "bound of each per-session queue, in messages (25 frames = 2 s of audio)"
    )
    connect_timeout_s: float = setting(
        10.0,
        "seconds the caller has to send its config, and the gateway to open a frontend "
        "stream (config sent, FrontendReady back; per replica tried)",
    )
    idle_timeout_s: float = setting(
        10.0,
        "seconds the gateway waits for the caller's audio (the first after the config "
        "included; empty messages and keys pressed do not count) before ending the call "
        "with DEADLINE_EXCEEDED (0 = forever)",
    )
    dtmf_per_s: float = setting(
        5.0, "keys a caller may press a second after a burst of dtmf_burst; more are dropped"
    )
    dtmf_burst: int = setting(10, "keys a caller may press at once (see dtmf_per_s)")
    dtmf_in_records: bool = setting(
        False,
        "keep the keys callers press (PINs, account numbers) in the session record and the "
        "conversation the gateway writes (off: '*' per key, '(pressed a key)')",
    )
    input_burst_s: float = setting(
        2.0,
        "seconds of audio a caller may send ahead of real time; more is refused with "
        "RESOURCE_EXHAUSTED (0 = no pacing)",
    )
    max_chunk_s: float = setting(
        1.0,
        "most audio one message may carry, in seconds of the input format "
        "(RESOURCE_EXHAUSTED above)",
    )
    redis_timeout_s: float = redis_timeout_setting()
    drain_timeout_s: float = setting(
        15.0, "after the caller half-closes, seconds upstreams get to finish their output"
    )
    turn_end_silence_s: float = setting(
        0.0,
        "tts engine: a fixed pause that ends each turn, in seconds (0 = the frontend replica's "
        "turn detection: Smart Turn by default, see services/frontend/config.py)",
    )
    hold_phrases: str = setting(
        "Hmm,|Let me see,",
        "tts engine, tandem mode: acknowledgements ('|'-separated) said while the agent holds "
        "the floor for an answer to what the caller said (empty = hold in silence)",
    )
    hold_max_s: float = setting(
        0.0,
        "tts engine: longest hold before the agent gives the floor back, up to 10 s "
        "(0 = the default, 5 s)",
    )
    allow_instructions: bool = setting(
        False,
        "let callers add their own instructions (ConverseConfig.instructions, the Realtime "
        "endpoint's session instructions) to the oracle's system prompt (off: PERMISSION_DENIED)",
    )
    instructions_max_chars: int = setting(
        2000, "longest instructions a caller may add (INVALID_ARGUMENT above)"
    )
    max_client_functions: int = setting(
        32,
        "functions a caller may declare for the agent to call (ConverseConfig.functions; "
        "INVALID_ARGUMENT above; 0 = none). The oracle has its own max_client_functions: "
        "keep this at most that",
    )
    user_text_max_chars: int = setting(
        2000,
        "longest typed message (UserText) a caller may send; longer ones get Notice REFUSED "
        "(0 = typed messages are refused)",
    )
    user_text_per_s: float = setting(
        1.0,
        "typed messages a caller may send a second after a burst of 5; more get Notice "
        "REFUSED (0 = no limit)",
    )
    context_max_chars: int = setting(
        4000,
        "longest commentary, thinking or instructions (AgentContext) a caller may send; longer "
        "ones get Notice REFUSED (0 = none taken)",
    )
    context_per_s: float = setting(
        5.0,
        "commentary, thinking and instructions a caller may send a second after a burst of 10; "
        "more get Notice REFUSED (0 = no limit)",
    )
    side_heartbeat_s: float = setting(
        0.5,
        "stt sends progress after this much audio, the oracle a heartbeat this often: "
        "their sign of life while nobody speaks",
    )
    side_timeout_s: float = setting(
        2.0,
        "an stt or oracle stream that sends nothing this long while caller audio flows "
        "has failed and is reopened (0 = never; a failed call still is)",
    )
    side_backoff_s: float = setting(
        0.5, "first wait before reopening a failed stt or oracle stream (doubles each time)"
    )
    side_backoff_max_s: float = setting(
        2.0,
        "longest wait between reopenings of a side stream (a reopening that fails costs "
        "one refused call; a long wait costs the question asked while the upstream came back)",
    )
    stt_replay_s: float = setting(
        20.0,
        "most caller audio kept for a reopened stt stream: the utterance the failed one had "
        "not finalized is sent to the new one first, so its transcript is whole",
    )
    cascade_stt_endpoint_s: float = setting(
        3.0,
        "cascade calls on the tts engine: stt's own pause that ends an utterance, longer than "
        "the engine's turn detection waits, so the final (and the LLM) come at the caller's "
        "turn end, as a true cascade's do (0.1-5; tandem keeps stt's short default, 0.5 s)",
    )
    readiness_interval_s: float = setting(
        0.5,
        "how often the gateway checks that stt, the oracle and a frontend answer SERVING; "
        "until they do, its health is NOT_SERVING and new calls are refused with UNAVAILABLE "
        "and a retry hint (0 = no check: always ready)",
    )
    resume_secret: str = setting(
        "",
        "HMAC key of resume tokens, the same on every replica (empty = calls cannot be resumed)",
    )
    resume_ttl_s: float = setting(
        300.0, "a resume token continues its session this long after the session was last alive"
    )

    def upstream_tls(self) -> ClientTls:
        """How the gateway dials frontend, stt and oracle: plaintext, TLS or mTLS."""
        return ClientTls(
            ca_file=self.upstream_ca_file,
            cert_file=self.upstream_cert_file,
            key_file=self.upstream_key_file,
            server_name=self.upstream_server_name,
            setting_prefix="upstream_",
        )

    def validate(self) -> None:
        super().validate()
        for token in parse_tokens(self.auth_tokens):
            check_token("auth_tokens", token)
        check_secret("registry_secret", self.registry_secret)
        check_secret("resume_secret", self.resume_secret)
        check_answer_time_factor(self.answer_time_factor)
        self._check_published()
        if self.resume_ttl_s <= 0:
            raise ConfigError(f"resume_ttl_s: must be above 0, got {self.resume_ttl_s:g}")
        if not 0.1 <= self.cascade_stt_endpoint_s <= 5.0:  # stt's range (stt/config.py)
            raise ConfigError(
                f"cascade_stt_endpoint_s: 0.1 to 5, got {self.cascade_stt_endpoint_s:g}"
            )
        if bool(self.upstream_cert_file) != bool(self.upstream_key_file):
            raise ConfigError("upstream_cert_file, upstream_key_file: set both (mTLS) or neither")
        if self.upstream_cert_file and not self.upstream_ca_file:
            raise ConfigError(
                "upstream_cert_file: a client certificate needs TLS to upstreams: "
                "set upstream_ca_file too"
            )
        check_not_negative(
            self,
            "dtmf_per_s",
            "idle_timeout_s",
            "input_burst_s",
            "redis_timeout_s",
            "readiness_interval_s",
            "stt_replay_s",
            "instructions_max_chars",
            "max_client_functions",
            "user_text_max_chars",
            "user_text_per_s",
            "context_max_chars",
            "context_per_s",
        )
        if self.max_chunk_s <= 0:
            raise ConfigError(f"max_chunk_s: must be positive, got {self.max_chunk_s}")
        if self.connect_timeout_s <= 0:
            raise ConfigError(f"connect_timeout_s: must be positive, got {self.connect_timeout_s}")
        if self.upstream_server_name and not self.upstream_ca_file:
            raise ConfigError("upstream_server_name: applies to TLS only: set upstream_ca_file")
        self._validate_side_streams()
        try:
            split_hold_phrases(self.hold_phrases)
            check_hold_max_s(self.hold_max_s)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def _check_published(self) -> None:
        """ConfigError for a client port published beyond this machine that admits
        every caller."""
        if not self.published_on or _is_loopback(self.published_on):
            return
        if not (parse_tokens(self.auth_tokens) or self.tls_client_ca_file):
            raise ConfigError(
                f"published_on: the client port is published on {self.published_on}, beyond "
                "this machine, with no auth_tokens and no tls_client_ca_file: anyone who "
                "reaches it could call (and spend its LLM); set KAME_GATEWAY_AUTH_TOKENS "
                "(e.g. `openssl rand -hex 32`) or keep KAME_BIND on 127.0.0.1"
            )

    def _validate_side_streams(self) -> None:
        if not 0.1 <= self.side_heartbeat_s <= 60:
            raise ConfigError(
                f"side_heartbeat_s: must be between 0.1 and 60, got {self.side_heartbeat_s:g}"
            )
        if self.side_timeout_s < 0 or 0 < self.side_timeout_s <= self.side_heartbeat_s:
            raise ConfigError(
                f"side_timeout_s: must exceed side_heartbeat_s ({self.side_heartbeat_s:g}) "
                f"or be 0, got {self.side_timeout_s:g}"
            )
        if self.side_backoff_s <= 0 or self.side_backoff_max_s < self.side_backoff_s:
            raise ConfigError(
                "side_backoff_s, side_backoff_max_s: need 0 < side_backoff_s <= "
                f"side_backoff_max_s, got {self.side_backoff_s:g} and {self.side_backoff_max_s:g}"
            )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
