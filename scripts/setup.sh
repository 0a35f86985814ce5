#!/usr/bin/env bash
# Create .venv (idempotent) and install lit_rl with the CPU constraints.
# Usage: scripts/setup.sh [dev]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
extras=""
[ "${1:-}" = "dev" ] && extras="[dev]"
stamp=".venv/.installed${extras}"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints-cpu.txt -nt "$stamp" ]; then
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -c constraints-cpu.txt -e ".${extras}"
  touch "$stamp"
fi
