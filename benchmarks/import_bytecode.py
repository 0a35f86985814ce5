"""Start-up cost of lit_rl's stack with and without cached bytecode (why ``scripts/setup.sh`` runs compileall).

    python benchmarks/import_bytecode.py                 # 3 repeats of each, best kept
    python benchmarks/import_bytecode.py --repeats 1 --modules "json, unittest"   # any import list

Each repeat is a fresh ``python -c "import <modules>"`` process. "with .pyc" uses the venv as it is (setup.sh
compiled it); "no .pyc" points ``PYTHONPYCACHEPREFIX`` at an empty folder with ``PYTHONDONTWRITEBYTECODE=1``,
so every module (the standard library too) is compiled from source, as every process did here before the
bytecode step: uv writes no .pyc files and this project's machines set ``PYTHONDONTWRITEBYTECODE=1``.
Prints a table, then one JSON line with the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

MODULES = "lit_rl.loggers, transformers, lightning.pytorch, mlflow"


def _best(modules: str, env: dict[str, str], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", f"import {modules}"], env=env, check=True)
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="processes per variant; the fastest is kept")
    ap.add_argument("--modules", default=MODULES, help=f"what each process imports (default: {MODULES})")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    with_pyc = _best(args.modules, base, args.repeats)
    with tempfile.TemporaryDirectory() as empty:
        cold = {**base, "PYTHONPYCACHEPREFIX": empty, "PYTHONDONTWRITEBYTECODE": "1"}
        no_pyc = _best(args.modules, cold, args.repeats)
    print(f"import {args.modules}  (best of {args.repeats} fresh processes, {os.cpu_count()} CPUs)")
    print(f"{'variant':<10} {'seconds':>8} {'ratio':>7}")
    print(f"{'with .pyc':<10} {with_pyc:>8.2f} {1.0:>6.2f}x")
    print(f"{'no .pyc':<10} {no_pyc:>8.2f} {no_pyc / with_pyc:>6.2f}x")
    print(json.dumps({"benchmark": "import_bytecode", "modules": args.modules, "repeats": args.repeats,
                      "with_pyc_s": round(with_pyc, 3), "no_pyc_s": round(no_pyc, 3),
                      "no_pyc_over_with_pyc": round(no_pyc / with_pyc, 3),
                      "machine": {"cpu_count": os.cpu_count(), "loadavg": list(os.getloadavg()),
                                  "python": platform.python_version()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
