"""Admission by capacity (services/gateway/admission.py): a real gateway, the fake
upstreams and the real Redis registry, where the test writes stt and oracle
records as their replicas would (signed with the fakes' registry secret)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import grpc
import pytest
from prometheus_client import REGISTRY

from kame_common import store
from kame_common.answer_time import AnswerTimes
from kamepb import gateway_pb2, gateway_pb2_grpc
from kamepb.common_pb2 import LLM_BACKEND_OPENAI
from services.gateway.admission import CapacityGate
from services.gateway.connections import RegistryReads
from services.gateway.plan import SessionError
from tests.gateway.test_resume import broken_off
from tests.gateway.test_session import converse, frame_bytes, held_open
from tests.support import wait_until

Config = gateway_pb2.ConverseConfig
SECRET = "registry-secret-of-the-fake-upstreams"  # the fakes' gateways' registry_secret


@pytest.fixture
async def registries(fakes):
    """stt and oracle registries in the fakes' Redis db; every record withdrawn after."""
    client = store.connect(fakes.redis_url)
    made = {name: store.CapacityRegistry(client, name, secret=SECRET) for name in ("stt", "oracle")}
    yield made
    for registry in made.values():
        for replica in await registry.replicas():
            await registry.withdraw(replica.replica_id)
    await client.aclose()


def refusals(service: str) -> float:
    labels = {"service": service}
    return REGISTRY.get_sample_value("kame_gateway_capacity_refusals_total", labels) or 0.0


def refused_call(address: str, config: Config) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    """A call refused at admission: its status, details and trailing metadata (sync
    API: see tests.gateway.fakes.sync_converse)."""

    def requests() -> Iterator[gateway_pb2.ConverseRequest]:
        yield gateway_pb2.ConverseRequest(config=config)
        yield gateway_pb2.ConverseRequest(audio=frame_bytes())

    with grpc.insecure_channel(address) as channel:
        call = gateway_pb2_grpc.GatewayStub(channel).Converse(requests())
        try:
            list(call)
        except grpc.RpcError:
            pass
        return call.code(), call.details() or "", dict(call.trailing_metadata() or ())


async def test_a_call_stt_cannot_serve_is_refused_with_a_retry_hint(fakes, registries):
    gateway = await fakes.gateway()
    await registries["stt"].publish("stt-a", "10.0.0.1:50053", free_slots=0, total_slots=3)
    opened, before = fakes.frontend.log.opened, refusals("stt")
    code, details, trailing = await asyncio.to_thread(refused_call, gateway.address, Config())
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "stt is at capacity" in details and "retry in 3 s" in details
    assert trailing.get("retry-after-s") == "3"
    assert refusals("stt") == before + 1
    assert fakes.frontend.log.opened == opened  # refused before any upstream stream


async def test_free_sessions_are_counted_down_by_the_gateways_own_admissions(fakes, registries):
    """Two replicas with one free session each: two calls go in before either
    republishes, the third is refused; a fresh record makes room again."""
    gateway = await fakes.gateway()
    for replica in ("stt-a", "stt-b"):
        await registries["stt"].publish(replica, "10.0.0.1:50053", free_slots=1, total_slots=2)
    for _ in range(2):
        assert (await converse(gateway.address, frames=2)).code == grpc.StatusCode.OK
    code, _details, _trailing = await asyncio.to_thread(refused_call, gateway.address, Config())
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    await asyncio.sleep(0.002)  # the new record is written after the calls it counts
    await registries["stt"].publish("stt-a", "10.0.0.1:50053", free_slots=1, total_slots=2)
    assert (await converse(gateway.address, frames=2)).code == grpc.StatusCode.OK


async def test_simultaneous_calls_get_only_the_free_sessions(fakes, registries):
    """The race: the gate awaited Redis between its check and its count, so ten calls
    set up at once all read the same two free sessions and all went in."""
    await registries["stt"].publish("stt-a", "10.0.0.1:50053", free_slots=2, total_slots=4)
    client = store.connect(fakes.redis_url)
    try:
        gate = CapacityGate(client, RegistryReads(), SECRET)
        outcomes = await asyncio.gather(
            *(gate.admit(["stt"]) for _ in range(10)), return_exceptions=True
        )
    finally:
        await client.aclose()
    refused = [o for o in outcomes if isinstance(o, SessionError)]
    assert outcomes.count(None) == 2, outcomes
    assert len(refused) == 8
    assert all(o.code == grpc.StatusCode.RESOURCE_EXHAUSTED for o in refused)


async def test_without_records_or_with_admission_off_calls_go_in(fakes, registries):
    gateway = await fakes.gateway()
    assert (await converse(gateway.address, frames=2)).code == grpc.StatusCode.OK
    await registries["stt"].publish("stt-a", "10.0.0.1:50053", free_slots=0, total_slots=1)
    open_gateway = await fakes.gateway(capacity_admission=False)
    assert (await converse(open_gateway.address, frames=2)).code == grpc.StatusCode.OK


async def test_records_signed_with_another_secret_do_not_refuse(fakes, redis_url):
    """Whoever can write to Redis without the secret cannot shut the door."""
    client = store.connect(fakes.redis_url)
    forged = store.CapacityRegistry(client, "stt", secret="another-secret-of-thirty-two-chars")
    try:
        await forged.publish("stt-forged", "10.0.0.9:50053", free_slots=0, total_slots=1)
        gateway = await fakes.gateway()
        assert (await converse(gateway.address, frames=2)).code == grpc.StatusCode.OK
    finally:
        await forged.withdraw("stt-forged")
        await client.aclose()


async def test_the_oracle_counts_only_calls_on_its_own_llm(fakes, registries):
    gateway = await fakes.gateway()
    await registries["oracle"].publish("oracle-a", "10.0.0.2:50054", free_slots=0, total_slots=2)
    code, details, _trailing = await asyncio.to_thread(
        refused_call, gateway.address, Config(mode=Config.TANDEM)
    )
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "oracle is at capacity" in details
    s2s = await converse(gateway.address, frames=2, config=Config(mode=Config.S2S))
    assert s2s.code == grpc.StatusCode.OK
    own = gateway_pb2.LlmOverride(base_url="https://llm.example.com/v1", api_key="sk-own-key")
    hosted = Config(mode=Config.TANDEM, llm=own)
    assert (await converse(gateway.address, frames=2, config=hosted)).code == grpc.StatusCode.OK
    # Client delegation: the caller's back-end answers, no LLM of the oracle's runs.
    delegating = Config(
        mode=Config.TANDEM,
        delegation=gateway_pb2.DelegationConfig(target=gateway_pb2.DelegationConfig.CLIENT),
    )
    assert (await converse(gateway.address, frames=2, config=delegating)).code == grpc.StatusCode.OK


@pytest.mark.parametrize(
    "llm",
    [
        gateway_pb2.LlmOverride(),  # present, every field empty: the oracle's own LLM
        gateway_pb2.LlmOverride(backend=LLM_BACKEND_OPENAI),  # the oracle's server, by another name
        gateway_pb2.LlmOverride(model="gemma-3-270m"),
        gateway_pb2.LlmOverride(base_url="https://llm.example.com/v1"),  # no key: the service's
    ],
    ids=["empty", "backend-only", "model-only", "url-without-key"],
)
async def test_an_override_on_the_oracles_own_llm_takes_its_capacity(fakes, registries, llm):
    """The attack: an override that changes nothing (or only names what the oracle
    serves with its own LLM and key) used to skip the oracle's capacity check."""
    gateway = await fakes.gateway()
    await registries["oracle"].publish("oracle-a", "10.0.0.2:50054", free_slots=0, total_slots=2)
    opened = fakes.oracle.log.opened
    code, details, _trailing = await asyncio.to_thread(
        refused_call, gateway.address, Config(mode=Config.TANDEM, llm=llm)
    )
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "oracle is at capacity" in details
    assert fakes.oracle.log.opened == opened


async def test_an_empty_override_is_no_override(fakes):
    """It reaches the oracle as no override at all, and a session with it is no
    session with an override (its oracle refusals are side failures, retried)."""
    gateway = await fakes.gateway()
    config = Config(mode=Config.TANDEM, llm=gateway_pb2.LlmOverride())
    assert (await converse(gateway.address, frames=2, config=config)).code == grpc.StatusCode.OK
    (oracle_config,) = fakes.oracle.log.of("config")
    assert not (oracle_config.backend or oracle_config.model or oracle_config.base_url)


async def test_a_resumed_call_is_admitted_like_a_new_one(fakes, registries):
    """The attack: a resume token used to be a way past every capacity check."""
    gateway = await fakes.gateway(resume_secret="resume-secret-of-at-least-32-chars!")
    started = await broken_off(fakes, gateway.address)
    await registries["stt"].publish("stt-a", "10.0.0.1:50053", free_slots=0, total_slots=1)
    opened = fakes.frontend.log.opened
    code, details, trailing = await asyncio.to_thread(
        refused_call, gateway.address, Config(resume_token=started.resume_token)
    )
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "stt is at capacity" in details
    assert trailing.get("retry-after-s") == "3"
    assert fakes.frontend.log.opened == opened


async def test_a_resumed_call_counts_against_max_sessions(fakes):
    gateway = await fakes.gateway(
        max_sessions=1, resume_secret="resume-secret-of-at-least-32-chars!"
    )
    token = (await broken_off(fakes, gateway.address)).resume_token
    # The broken-off call frees its slot once the gateway has seen the cancel: on a
    # loaded machine that can come after the next call, which was then refused.
    await wait_until(lambda: gateway.active_sessions == 0, "the broken-off call to end", 5)
    release = asyncio.Event()
    async with grpc.aio.insecure_channel(gateway.address) as channel:
        holder = gateway_pb2_grpc.GatewayStub(channel).Converse(held_open(release, frames=0))
        assert (await holder.read()).HasField("started")
        code, details, _ = await asyncio.to_thread(
            refused_call, gateway.address, Config(resume_token=token)
        )
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "limit of 1 sessions" in details
        release.set()
        assert await holder.code() == grpc.StatusCode.OK


async def test_a_call_past_the_answer_time_bound_is_refused_until_one_ends(fakes):
    """Answers measured 0.5 x unloaded slower per extra call: at 1.5x the gateway
    holds two calls; the third is told to retry when the first is expected to end."""
    now = [1000.0]
    answers = AnswerTimes(1.5, clock=lambda: now[0])
    for _ in range(3):
        answers.answered(0.8, 1)
    answers.answered(1.2, 2)
    for _ in range(3):  # calls of 40 s, ended
        number = answers.call_started()
        now[0] += 40
        answers.call_ended(number)
    gateway = await fakes.gateway(answers=answers)
    held = [answers.call_started(), answers.call_started()]  # two calls in progress
    now[0] += 10
    opened = fakes.frontend.log.opened
    code, details, trailing = await asyncio.to_thread(refused_call, gateway.address, Config())
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "1.5x an unloaded call" in details
    assert trailing.get("retry-after-s") == "30"  # the first held call's 40 s, 10 s in
    assert fakes.frontend.log.opened == opened
    answers.call_ended(held[0])
    assert (await converse(gateway.address, frames=2)).code == grpc.StatusCode.OK
    assert answers.calls_held == 1  # the admitted call was counted, and let go when it ended
