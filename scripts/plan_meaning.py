"""Do the reproduce plans still run what they ran? Every job of ``python -m lit_rl reproduce`` (both studies, every
task and testbed, full and ``--quick``) resolved as ``python -m lit_rl fit`` would resolve it, in this checkout and
at a git ref, compared job by job.

    python scripts/plan_meaning.py --ref main

A fit job is its resolved config without what names the run (its folder, MLflow tags and store, the config
files' paths); a sweep job is its sweep file's base with its overrides resolved the same way, plus its space; an
evaluation job is its extra files' content. Prints one line per job that differs or exists on one side only and a
JSON line last; exits 1 if any does.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

#: (study module, keyword, value) of every plan; seeds [0, 1], two workers, one thread each
PLANS = [("erils", "task", "sudoku"), ("erils", "task", "countdown"),
         ("dr", "testbed", "chainsum"), ("dr", "testbed", "guess")]
RUN_KEYS = ("--trainer.default_root_dir=", "--trainer.logger.init_args.", "--threads=")


def _resolve(argv: list[str]) -> dict[str, Any]:
    from config_meaning import _canonical, _tests_conftest

    from lit_rl.config.edits import expand_list_edits

    parser = _tests_conftest().training_parser()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resolved = parser.parse_args(expand_list_edits(argv)).as_dict()
    resolved.pop("config", None)
    resolved.get("trainer", {}).pop("default_root_dir", None)
    resolved.get("trainer", {}).get("logger", {}).get("init_args", {}).pop("tags", None)
    return _canonical(resolved)


def dump(out: Path) -> dict[str, Any]:
    """``"<plan>/<quick|full>/<job>" -> what it runs`` for this checkout (run with the checkout as the cwd)."""
    import importlib

    import yaml

    result: dict[str, Any] = {}
    for module, key, value in PLANS:
        study = importlib.import_module(f"lit_rl.reproduce.{module}")
        for quick in (False, True):
            where = out / f"{module}_{value}_{quick}"
            plan = study.plan(where, seeds=[0, 1], quick=quick, workers=2, threads=1, cache_dir="CACHE",
                              **{key: value})
            for job in [*plan.jobs, *getattr(plan, "eval_jobs", [])]:
                label = f"{module}:{value}/{'quick' if quick else 'full'}/{job.name}"
                if job.argv[0] == "fit":
                    argv = [a for a in job.argv[1:] if not a.startswith(RUN_KEYS)]
                    result[label] = {"config": _resolve(argv), "threads": [a for a in job.argv if
                                                                             a.startswith("--threads=")]}
                elif job.argv[0] == "sweep":
                    cfg = yaml.safe_load(Path(job.argv[2]).read_text())
                    overlay = where / f"{job.name}_overrides.yaml"
                    overrides = dict(cfg["overrides"])
                    threads = overrides.pop("threads", None)
                    overlay.write_text(yaml.safe_dump(overrides))
                    argv = [a for b in cfg["base"] for a in ("--config", b)] + ["--config", str(overlay)]
                    result[label] = {"config": _resolve(argv), "space": cfg["space"], "threads": threads,
                                     "objective": cfg["objective"], "study": cfg["study_name"]}
                else:
                    files = [a for a in job.argv[3:] if not a.startswith("--")]
                    result[label] = {"argv0": job.argv[0], "files": [
                        yaml.safe_load(Path(f).read_text()) if Path(f).is_file() else f for f in files[1:]]}
    return result


def _at_ref(ref: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), ref], check=True,
                       capture_output=True)
        try:
            # this script from here, then the ref's lit_rl and scripts before everything (nothing imported them yet)
            code = (f"import sys, json; sys.path.insert(0, {str(ROOT / 'scripts')!r}); import plan_meaning, pathlib;"
                    f"sys.path[:0] = [{str(tree)!r}, {str(tree / 'scripts')!r}];"
                    f"print(json.dumps(plan_meaning.dump(pathlib.Path({str(Path(tmp) / 'out')!r}))))")
            proc = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True)
            if proc.returncode:
                raise SystemExit(f"the plans at {ref} did not resolve:\n{proc.stderr[-3000:]}")
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", required=True, help="the git ref to compare with (e.g. main)")
    args = ap.parse_args(argv)
    before = _at_ref(args.ref)
    with tempfile.TemporaryDirectory() as tmp:
        import os

        here = os.getcwd()
        os.chdir(ROOT)
        try:
            now = dump(Path(tmp))
        finally:
            os.chdir(here)
    differ = []
    for label in sorted(set(before) | set(now)):
        if label not in before or label not in now:
            print(f"{label}: only {'now' if label in now else 'at ' + args.ref}")
            differ.append(label)
        elif before[label] != now[label]:
            keys = _diff(before[label], now[label])
            print(f"{label}: differs at {', '.join(keys[:4])}")
            differ.append(label)
    print(json.dumps({"ref": args.ref, "jobs": len(set(before) | set(now)), "equal": len(set(before) | set(now))
                      - len(differ), "differ": differ}))
    return 1 if differ else 0


def _diff(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str) for d in _diff(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [path or "."]


if __name__ == "__main__":
    raise SystemExit(main())
