"""What the bench ran on: the machine, the package versions and the models."""

from __future__ import annotations

import contextlib
import os
import platform
import re
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from kame_cli.bench.config import BenchConfig
from kame_common.config import load_settings
from services.stt.config import SttSettings

PACKAGES = (
    "grpcio",
    "faster-whisper",
    "ctranslate2",
    "llama_cpp_python",
    "piper-tts",
    "moshi",
    "torch",
    "redis",
)


def _cpu_name() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        names = re.findall(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        cpu = names[0] if names else cpu
    return cpu


def _gpu_name() -> str:
    gpu = "none"
    if shutil.which("nvidia-smi"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            gpu = (
                subprocess.run(
                    ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                    capture_output=True,
                    text=True,
                    timeout=10,
                ).stdout.strip()
                or gpu
            )
    return gpu


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def machine_description() -> dict[str, Any]:
    memory_gib = None
    with contextlib.suppress(OSError, ValueError, AttributeError):
        memory_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    versions = {}
    for package in PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[package] = metadata.version(package)
    return {
        "cpu": _cpu_name(),
        "cores": os.cpu_count(),
        "memory_gib": memory_gib,
        "gpu": _gpu_name(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "load_average": load_average(),
        "packages": versions,
    }


def stt_description() -> str:
    """The stt's Whisper as the stack runs it (its settings from the environment)."""
    stt = load_settings(SttSettings, argv=[])
    model = stt.model_dir or f"Whisper {stt.model} (embedded)"
    return (
        f"faster-whisper, {model}, {stt.compute_type or 'int8 on CPU'}, finals beam "
        f"{stt.beam_size}, pre-roll {stt.pre_roll_s:g} s"
    )


def models_description(config: BenchConfig) -> dict[str, str]:
    return {
        "stt": stt_description(),
        "llm": config.llm_base_url
        or "Gemma 3 270M Q4_K_M on llama.cpp (embedded, kame llm-server)",
        "tts": "piper, joe voice (embedded)",
        "kame/moshi checkpoint": config.checkpoint or "none",
    }
