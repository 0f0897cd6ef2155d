"""Every `kame` failure a user meets first is one line on stderr that says what
went wrong and what to do, with a non-zero exit status and no traceback
(unless `kame --debug`). Each case runs the real command as a process."""

from __future__ import annotations

import socket
import wave

import pytest

from kame_cli.errors import exit_code, one_line
from kame_cli.stack_options import free_ports
from kame_common.config import ConfigError
from tests.cli.conftest import assert_fails_in_one_line, kame


def talk_args(wav, tmp_path, *extra: str) -> list[str]:
    out, timeline = tmp_path / "answer.wav", tmp_path / "timeline.json"
    return ["talk", "--wav", str(wav), "--out", str(out), "--timeline", str(timeline), *extra]


def talk(wav, tmp_path, *extra: str, env: dict[str, str] | None = None):
    return kame(*talk_args(wav, tmp_path, "--max-wait-s", "5", *extra), env=env)


def talk_over_tls(wav, tmp_path, gateway, ca_file, token: str | None = None):
    """`kame talk` to a TLS gateway, trusting `ca_file`, with the gateway's token
    unless another is given."""
    env = {"KAME_AUTH_TOKEN": token or gateway.token}
    return talk(wav, tmp_path, "--gateway", gateway.address, "--ca-file", str(ca_file), env=env)


@pytest.fixture
def held_port():
    """A port some other process listens on (this test's plain socket)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_talk_without_a_stack_says_the_gateway_is_unreachable(wav, tmp_path):
    address = f"127.0.0.1:{free_ports(1)[0]}"
    line = assert_fails_in_one_line(
        talk(wav, tmp_path, "--gateway", address),
        1,
        r"^kame talk: gateway unreachable at 127\.0\.0\.1:\d+: is `kame up` running\?",
    )
    assert address in line
    assert not (tmp_path / "timeline.json").exists()  # no session: nothing saved


def test_talk_with_a_missing_wav_names_it(tmp_path):
    missing = tmp_path / "nope.wav"
    assert_fails_in_one_line(
        talk(missing, tmp_path), 2, rf"^kame talk: WAV file {missing} does not exist$"
    )


@pytest.mark.parametrize(
    ("channels", "width", "what"),
    [(2, 2, "16-bit 2-channel audio at 16000 Hz"), (1, 1, "8-bit 1-channel audio at 16000 Hz")],
)
def test_talk_with_a_wav_that_is_not_16_bit_mono_says_what_it_is(tmp_path, channels, width, what):
    path = tmp_path / "odd.wav"
    with wave.open(str(path), "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(width)
        out.setframerate(16_000)
        out.writeframes(b"\x00" * 1600 * channels * width)
    assert_fails_in_one_line(
        talk(path, tmp_path), 2, rf"^kame talk: {path} is {what}; .*16-bit mono PCM"
    )


def test_talk_with_a_file_that_is_not_a_wav(tmp_path):
    path = tmp_path / "notes.wav"
    path.write_text("not audio at all")
    assert_fails_in_one_line(talk(path, tmp_path), 2, rf"^kame talk: {path} is not a PCM WAV file")


def test_talk_refused_by_the_gateway_auth(wav, tmp_path, tls_gateway):
    result = talk_over_tls(
        wav, tmp_path, tls_gateway, tls_gateway.ca_file, token="not-the-token-but-long-enough"
    )
    assert_fails_in_one_line(
        result,
        1,
        rf"^kame talk: the gateway at {tls_gateway.address} refused the credentials .*"
        "KAME_AUTH_TOKEN",
    )


def test_talk_with_the_wrong_ca_is_a_tls_error(wav, tmp_path, tls_gateway):
    result = talk_over_tls(wav, tmp_path, tls_gateway, tls_gateway.other_ca_file)
    assert_fails_in_one_line(
        result, 1, rf"^kame talk: TLS to the gateway at {tls_gateway.address} failed .*--ca-file"
    )


def test_talk_in_plaintext_to_a_tls_gateway_is_a_tls_error(wav, tmp_path, tls_gateway):
    result = talk(
        wav, tmp_path, "--gateway", tls_gateway.address, env={"KAME_AUTH_TOKEN": tls_gateway.token}
    )
    assert_fails_in_one_line(
        result, 1, rf"^kame talk: .*gateway at {tls_gateway.address}.*TLS.*--ca-file"
    )


def test_talk_with_a_missing_ca_file_names_it(wav, tmp_path):
    missing = tmp_path / "ca.crt"
    assert_fails_in_one_line(
        talk(wav, tmp_path, "--ca-file", str(missing)),
        2,
        rf"^kame talk: ca_file: cannot read {missing}: No such file or directory$",
    )


def test_kame_up_refuses_a_busy_port_before_starting_anything(tmp_path, held_port):
    stt, oracle, frontend, llm = free_ports(4)
    result = kame(
        "up",
        "--gateway-port",
        str(held_port),
        "--stt-port",
        str(stt),
        "--oracle-port",
        str(oracle),
        "--frontend-port",
        str(frontend),
        "--llm-port",
        str(llm),
        "--log-dir",
        str(tmp_path),
    )
    line = assert_fails_in_one_line(
        result,
        1,
        rf"^kame up: port {held_port} \(gateway\) is in use by PID \d+ \(.*python.*\): stop it",
    )
    assert "--gateway-port" in line
    assert "is up" not in result.stdout
    assert not list(tmp_path.glob("*.log")), "a process was started"


def test_llm_server_refuses_a_busy_port(held_port):
    assert_fails_in_one_line(
        kame("llm-server", "--port", str(held_port)),
        1,
        rf"^kame llm-server: port {held_port} is in use by PID \d+ .*: stop it or pass --port$",
    )


def test_status_without_a_stack_says_nothing_answers():
    address = f"127.0.0.2:{free_ports(1)[0]}"  # 127.0.0.2: no other stack's default ports
    assert_fails_in_one_line(
        kame("status", "--gateway", address, "--timeout-s", "1"),
        1,
        rf"^kame status: no service answers for the stack at {address}: is `kame up` running\?$",
    )


def test_say_with_a_missing_voice_names_it(tmp_path):
    missing = tmp_path / "voice.onnx"
    assert_fails_in_one_line(
        kame("say", "Hello", "--out", str(tmp_path / "q.wav"), "--voice", str(missing)),
        2,
        rf"^kame say: voice {missing} does not exist$",
    )


def test_bench_with_a_missing_checkpoint_names_it(tmp_path):
    missing = tmp_path / "ckpt"
    assert_fails_in_one_line(
        kame("bench", "--checkpoint", str(missing), "--out-dir", str(tmp_path)),
        2,
        rf"^kame bench: --checkpoint {missing} does not exist$",
    )


def test_debug_shows_the_traceback(tmp_path):
    missing = tmp_path / "nope.wav"
    result = kame("--debug", *talk_args(missing, tmp_path))
    assert result.returncode == 2
    assert "Traceback" in result.stderr and "CliError" in result.stderr
    assert result.stderr.strip().splitlines()[-1] == f"kame talk: WAV file {missing} does not exist"


def test_an_unexpected_error_is_one_line_that_points_at_debug():
    assert one_line(ValueError("boom\n  at the end")) == (
        "unexpected ValueError: boom at the end (rerun as `kame --debug ...` for the traceback)"
    )
    assert exit_code(ValueError("boom")) == 1
    assert exit_code(ConfigError("port: bad")) == 2
    assert one_line(FileNotFoundError(2, "No such file or directory", "/x.wav")) == (
        "/x.wav does not exist"
    )
