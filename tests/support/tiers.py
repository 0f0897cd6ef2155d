"""Every test's tier, in one place (docs/testing.md says what each tier may use).

- unit: pure logic and sans-IO protocol code: no network, no model, no Redis
  (enforced: a unit test that opens an IP socket or a gRPC channel fails).
- service: real gRPC servers and HTTP/WebSocket servers on loopback, Redis,
  fakes (tests/gateway/fakes.py) for the models, subprocesses without models.
- models: real Whisper, piper, Smart Turn, llama.cpp (or the kame engine's torch
  model), alone or behind one service.
- e2e: `kame up` or the embedded stack, real clients (SDKs, a browser, SIP
  peers), real peers.

TIERS maps a test module, or a folder (ending in "/") whose every module is of one
tier, to its tier; the module's entry wins over its folder's. A test module that
no entry covers fails the collection, naming the file, so a new module is
registered here when it is added. A test whose tier differs from its module's
carries its own marker (`@pytest.mark.service`), which wins over this map.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import PurePosixPath

TIER_NAMES = ("unit", "service", "models", "e2e")

TIERS: dict[str, str] = {
    # Folders whose every module is of one tier.
    "tests/e2e/": "e2e",
    "tests/faults/": "e2e",
    # bench/
    "tests/bench/test_answer.py": "unit",
    "tests/bench/test_bench.py": "models",
    "tests/bench/test_dictation_set.py": "models",
    "tests/bench/test_full_duplex.py": "unit",
    "tests/bench/test_full_duplex_samples.py": "unit",
    "tests/bench/test_full_duplex_samples_espeak.py": "models",
    "tests/bench/test_gpu_check.py": "models",
    "tests/bench/test_heldout_questions.py": "models",
    "tests/bench/test_questions.py": "models",
    "tests/bench/test_report.py": "unit",
    "tests/bench/test_stt_bench.py": "models",
    "tests/bench/test_stt_wer.py": "models",
    "tests/bench/test_turn_taking.py": "models",
    "tests/bench/test_wer.py": "unit",
    # cli/
    "tests/cli/test_demo_verdict.py": "unit",
    "tests/cli/test_errors.py": "service",
    "tests/cli/test_free_ports.py": "service",
    "tests/cli/test_make_setup.py": "service",
    "tests/cli/test_readme_settings.py": "unit",
    "tests/cli/test_smart_turn_model.py": "models",
    "tests/cli/test_stack_status.py": "e2e",
    "tests/cli/test_talk_refusals.py": "service",
    "tests/cli/test_talk_say.py": "service",
    "tests/cli/test_timeline.py": "unit",
    "tests/cli/test_tools_flags.py": "service",
    "tests/cli/test_up_ports.py": "e2e",
    "tests/cli/test_up_urls.py": "e2e",
    # client/ and clients/
    "tests/client/test_client.py": "service",
    "tests/client/test_codecs.py": "models",
    "tests/client/test_events.py": "unit",
    "tests/client/test_status.py": "unit",
    "tests/clients/test_venvs.py": "service",
    # common/
    "tests/common/test_aio.py": "unit",
    "tests/common/test_answer_time.py": "unit",
    "tests/common/test_audio.py": "unit",
    "tests/common/test_capacity.py": "unit",
    "tests/common/test_config.py": "unit",
    "tests/common/test_entrypoints.py": "service",
    "tests/common/test_hold.py": "unit",
    "tests/common/test_http_server.py": "service",
    "tests/common/test_layering.py": "service",
    "tests/common/test_protos.py": "unit",
    "tests/common/test_recent_histograms.py": "unit",
    "tests/common/test_server.py": "service",
    "tests/common/test_store.py": "service",
    "tests/common/test_streams.py": "unit",
    "tests/common/test_voice.py": "models",
    # deploy/: rendered charts, compose files and Dockerfiles, read as text; the few
    # tests that start a real Redis or gRPC server on what was rendered are marked
    # service in their module.
    "tests/deploy/test_chart.py": "unit",
    "tests/deploy/test_chart_security.py": "unit",
    "tests/deploy/test_compose.py": "unit",
    "tests/deploy/test_containers.py": "unit",
    "tests/deploy/test_gateway_clients.py": "unit",
    "tests/deploy/test_images.py": "service",
    "tests/deploy/test_observability.py": "unit",
    "tests/deploy/test_ports.py": "unit",
    "tests/deploy/test_telephony.py": "unit",
    "tests/deploy/test_tools_config.py": "unit",
    "tests/deploy/test_web.py": "unit",
    # frontend/
    "tests/frontend/test_backchannels.py": "models",
    "tests/frontend/test_commit_policy.py": "unit",
    "tests/frontend/test_engine_watchdog.py": "service",
    "tests/frontend/test_frontend_service.py": "models",
    "tests/frontend/test_push_to_talk.py": "models",
    "tests/frontend/test_semantic_turns.py": "models",
    "tests/frontend/test_smart_turn.py": "models",
    "tests/frontend/test_tts_engine.py": "models",
    "tests/frontend/test_tts_stream.py": "models",
    "tests/frontend/test_turn_fusion.py": "unit",
    # gateway/
    "tests/gateway/test_admission.py": "service",
    "tests/gateway/test_cli.py": "service",
    "tests/gateway/test_client_functions.py": "service",
    "tests/gateway/test_delegation.py": "service",
    "tests/gateway/test_edge.py": "service",
    "tests/gateway/test_fuzz.py": "service",
    "tests/gateway/test_hung_redis.py": "unit",
    "tests/gateway/test_pacing.py": "unit",
    "tests/gateway/test_plan.py": "unit",
    "tests/gateway/test_push_to_talk.py": "models",
    "tests/gateway/test_readiness.py": "service",
    "tests/gateway/test_resume.py": "service",
    "tests/gateway/test_session.py": "service",
    "tests/gateway/test_sidestream.py": "unit",
    "tests/gateway/test_turns.py": "unit",
    # kame/: the tandem engine on a tiny random checkpoint (torch), or the real
    # Moshi parity trace.
    "tests/kame/test_batch.py": "models",
    "tests/kame/test_checkpoint.py": "models",
    "tests/kame/test_checkpoint_layouts.py": "models",
    "tests/kame/test_context_edge.py": "models",
    "tests/kame/test_engine.py": "models",
    "tests/kame/test_frontend_e2e.py": "models",
    "tests/kame/test_moshi_adapter.py": "unit",
    "tests/kame/test_oracle.py": "models",
    "tests/kame/test_parity.py": "models",
    "tests/kame/test_ticks.py": "models",
    # oracle/
    "tests/oracle/test_anthropic.py": "service",
    "tests/oracle/test_backchannels.py": "service",
    "tests/oracle/test_bad_input.py": "service",
    "tests/oracle/test_candidates.py": "service",
    "tests/oracle/test_capacity.py": "service",
    "tests/oracle/test_client_functions.py": "service",
    "tests/oracle/test_config.py": "unit",
    "tests/oracle/test_delegation.py": "service",
    "tests/oracle/test_failures.py": "service",
    "tests/oracle/test_heartbeat.py": "service",
    "tests/oracle/test_history.py": "service",
    "tests/oracle/test_llama_server.py": "models",
    "tests/oracle/test_llm_oracle.py": "models",
    "tests/oracle/test_llm_server_cli.py": "models",
    "tests/oracle/test_policy.py": "unit",
    "tests/oracle/test_prompts_and_words.py": "unit",
    "tests/oracle/test_token_budget.py": "service",
    "tests/oracle/test_tool_rules.py": "unit",
    "tests/oracle/test_tool_settings.py": "unit",
    "tests/oracle/test_tools.py": "service",
    "tests/oracle/test_warm_up.py": "models",
    # security/
    "tests/security/test_gateway_edge.py": "service",
    "tests/security/test_llm_keys.py": "service",
    "tests/security/test_registry.py": "service",
    "tests/security/test_secure_stack.py": "e2e",
    "tests/security/test_settings.py": "unit",
    "tests/security/test_tls.py": "service",
    # stt/
    "tests/stt/test_agreement.py": "unit",
    "tests/stt/test_bad_input.py": "models",
    "tests/stt/test_capacity.py": "models",
    "tests/stt/test_config.py": "unit",
    "tests/stt/test_end_of_turn.py": "models",
    "tests/stt/test_engine.py": "models",
    "tests/stt/test_hearing_options.py": "models",
    "tests/stt/test_process.py": "models",
    "tests/stt/test_repeats.py": "models",
    "tests/stt/test_scheduler.py": "unit",
    "tests/stt/test_streams.py": "models",
    "tests/stt/test_text_metrics.py": "unit",
    "tests/stt/test_transcribe.py": "models",
    "tests/stt/test_vad.py": "models",
    "tests/stt/test_whisper.py": "models",
    # telephony/: the few tests of a module that call the embedded stack are marked e2e
    # in it.
    "tests/telephony/test_audiosocket.py": "service",
    "tests/telephony/test_call_control.py": "service",
    "tests/telephony/test_call_functions.py": "service",
    "tests/telephony/test_phone_call.py": "service",
    "tests/telephony/test_playout.py": "unit",
    "tests/telephony/test_sip.py": "service",
    "tests/telephony/test_sip_abuse.py": "service",
    "tests/telephony/test_sip_adapter.py": "unit",
    "tests/telephony/test_sip_load.py": "e2e",
    "tests/telephony/test_sip_stack.py": "e2e",
    "tests/telephony/test_twilio.py": "service",
    # web/
    "tests/web/test_admission.py": "unit",
    "tests/web/test_bridge_loop.py": "service",
    "tests/web/test_live_endpoint.py": "service",
    "tests/web/test_live_protocol.py": "unit",
    "tests/web/test_moshi_chat.py": "service",
    "tests/web/test_moshi_limits.py": "service",
    "tests/web/test_moshi_protocol.py": "unit",
    "tests/web/test_pacer.py": "unit",
    "tests/web/test_page.py": "unit",
    "tests/web/test_page_errors.py": "e2e",
    "tests/web/test_realtime.py": "service",
    "tests/web/test_realtime_adapter.py": "unit",
    "tests/web/test_realtime_backchannels.py": "service",
    "tests/web/test_realtime_limits.py": "service",
    "tests/web/test_realtime_protocol.py": "unit",
    "tests/web/test_realtime_tools.py": "service",
    "tests/web/test_realtime_turns.py": "service",
    "tests/web/test_server.py": "service",
    "tests/web/test_web_admission.py": "service",
    "tests/web/test_web_memory.py": "service",
    # docs/: the docs (links, README commands, generated pages, the site)
    "tests/docs/test_configuration_page.py": "unit",
    "tests/docs/test_links.py": "unit",
    "tests/docs/test_readme_commands.py": "service",
    "tests/docs/test_site.py": "unit",
    # The helpers' own tests.
    "tests/test_support.py": "models",
    "tests/test_tiers.py": "unit",
}


def tier_of(module: str) -> str | None:
    """The tier of the tests in `module` (a path relative to the repository, with
    "/"), or None where TIERS has no entry for it."""
    if module in TIERS:
        return TIERS[module]
    for folder in PurePosixPath(module).parents:
        tier = TIERS.get(f"{folder}/")
        if tier is not None:
            return tier
    return None


class NetworkInUnitTest(AssertionError):
    """A unit-tier test opened an IP socket or a gRPC channel or server."""


_GRPC_FACTORIES = ("server", "insecure_channel", "secure_channel")


def no_network() -> Iterator[None]:
    """For the duration of a unit test: connecting or binding an IP socket, or making
    a gRPC channel or server, raises NetworkInUnitTest (so a test that needs Redis
    or a server is moved to the service tier instead of slowing the unit tier).
    Unix sockets (the event loop's self-pipe) stay allowed."""
    import grpc
    import grpc.aio

    def refuse(what: str):
        def refused(*_args: object, **_kwargs: object) -> None:
            raise NetworkInUnitTest(
                f"a unit test used {what}: give it the service tier in tests/support/tiers.py"
            )

        return refused

    originals: list[tuple[object, str, object]] = []

    def swap(owner: object, name: str, replacement: object) -> None:
        originals.append((owner, name, getattr(owner, name)))
        setattr(owner, name, replacement)

    for method in ("connect", "connect_ex", "bind"):
        real = getattr(socket.socket, method)

        def guarded(self: socket.socket, address: object, _real=real, _method=method) -> object:
            if self.family in (socket.AF_INET, socket.AF_INET6):
                raise NetworkInUnitTest(
                    f"a unit test called socket.{_method}({address!r}): give it the service "
                    "tier in tests/support/tiers.py"
                )
            return _real(self, address)

        swap(socket.socket, method, guarded)
    for module in (grpc, grpc.aio):
        for name in _GRPC_FACTORIES:
            swap(module, name, refuse(f"grpc.{name}"))
    try:
        yield
    finally:
        for owner, name, original in reversed(originals):
            setattr(owner, name, original)
