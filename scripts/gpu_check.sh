#!/usr/bin/env bash
# GPU readiness check of the kame stack (issue #18), on one GPU in under 8 minutes:
# the full 7B config with random weights in bfloat16, batched parity, step time at
# batch 1/8/32/64 with CUDA graphs, one gateway conversation with the kame engine on
# the GPU, Whisper on the GPU at 1 and 16 sessions. Writes bench/results/gpu_*.json
# and bench/results/gpu_check.md (kame_cli/bench/gpu_check.py does the work).
#
#   scripts/gpu_check.sh [--out DIR] [--keep-scratch] [--parts build,parity,step,e2e,stt] [--dtype D]
#   scripts/gpu_check.sh --cpu-smoke    # the same code on the CPU, tiny config (tests)
#
# The Python is $PYTHON, else the repo's .venv, else python3 on PATH.
# The capacity plan for a GPU (batch slots, the LLM on vLLM or an API): docs/capacity.md.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-}
if [[ -z $python ]]; then
    if [[ -x $root/.venv/bin/python ]]; then python=$root/.venv/bin/python; else python=python3; fi
fi

cpu_smoke=0
for arg in "$@"; do
    [[ $arg == --cpu-smoke ]] && cpu_smoke=1
done

if ((!cpu_smoke)); then
    if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
        echo "gpu_check: no NVIDIA GPU here (nvidia-smi is missing or lists none); run it on a GPU machine, or pass --cpu-smoke" >&2
        exit 2
    fi
    if ! "$python" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
        echo "gpu_check: $python has no CUDA torch (torch.cuda.is_available() is False); install a CUDA build of torch" >&2
        exit 2
    fi
    # Whisper's CTranslate2 looks for cuBLAS and cuDNN on the library path: those of
    # torch's nvidia-* wheels, when torch came from pip.
    wheel_libs=$("$python" -c 'import glob, os, site; print(":".join(sorted(glob.glob(os.path.join(site.getsitepackages()[0], "nvidia", "*", "lib")))))' 2>/dev/null || true)
    if [[ -n $wheel_libs ]]; then
        export LD_LIBRARY_PATH=$wheel_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    fi
fi

cd "$root"
# A hard stop well past the 8-minute goal, so that a hung part cannot hold the GPU.
exec timeout 900 "$python" -m kame_cli.bench.gpu_check "$@"
