"""The path one training batch's rollouts take through the code: which repository files it enters, in order.

A tiny fit runs in this process (``--config`` files and the tests' tiny overlay) with a profiler switched on only
inside ``PromptStreamDataModule.on_after_batch_transfer`` of one training batch (``--batch``, the second by
default: what the first builds once is not the path of every batch): the rollout side, i.e. sources, engine,
stages, scoring. Every Python call into a file of this repository is recorded; the path is that
sequence with repeats of the same file collapsed. Printed: the files entered, the hops (file changes along the
path), the same for the plumbing alone (the path without decoding internals, seeds, tasks, models and math), how
often the path crosses between two named files (``--between``), then one JSON line.

    python scripts/rollout_path.py --config conf/erils.yaml                                   # an ERILS batch
    python scripts/rollout_path.py --config conf/double_rollout.yaml --between datamodules/stream.py \\
        lit_rl/algorithms/dr_stage.py                                                         # a double-rollout one

Run it in two checkouts to compare a refactor (``--root`` names the checkout whose files count).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the work itself, not the plumbing between parts: decoding internals, seeds, tasks, models, pure math
WORK = ("lit_rl/generation/diffusion.py", "lit_rl/generation/cached.py", "lit_rl/generation/kv_stack.py",
        "lit_rl/generation/settings.py", "lit_rl/rng.py", "lit_rl/tasks/", "lit_rl/models/", "lit_rl/core/",
        "lit_rl/runs.py", "lit_rl/atomic.py", "lit_rl/errors.py")
TINY = {"conf/erils.yaml": "tests/tiny_overlay.yaml", "conf/double_rollout.yaml": "tests/tiny_dr_overlay.yaml"}


def trace(configs: list[str], root: Path, which: int = 2) -> list[str]:
    """The repository files entered during the ``which``-th training batch's rollouts (the second by default: the
    steady state, after what the first builds once), in call order, consecutive repeats collapsed."""
    sys.path.insert(0, str(root))
    from datamodules.stream import PromptStreamDataModule
    from lit_rl.cli import run_lightning_cli

    path: list[str] = []
    prefix = str(root) + "/"

    def prof(frame, event, arg):
        if event == "call":
            f = frame.f_code.co_filename
            if f.startswith(prefix) and "/.venv" not in f:
                rel = f[len(prefix):]
                if not path or path[-1] != rel:
                    path.append(rel)

    real = PromptStreamDataModule.on_after_batch_transfer
    done = {"n": 0}

    def traced(self, batch, idx):
        if not getattr(self.trainer, "training", False):
            return real(self, batch, idx)
        done["n"] += 1
        if done["n"] != which:
            return real(self, batch, idx)
        sys.setprofile(prof)
        try:
            return real(self, batch, idx)
        finally:
            sys.setprofile(None)
            self.trainer.should_stop = True  # the traced batch is the last

    PromptStreamDataModule.on_after_batch_transfer = traced
    overlay = TINY.get(configs[0])
    args = ["fit"] + [a for c in configs for a in ("--config", str(root / c))]
    if overlay:
        args += ["--config", str(root / overlay)]
    with tempfile.TemporaryDirectory() as tmp:
        run_lightning_cli(args + ["--trainer.limit_val_batches=0", f"--trainer.default_root_dir={tmp}",
                                  "--trainer.max_steps=64",
                                  f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp}/m.db",
                                  "--trainer.num_sanity_val_steps=0", "--trainer.callbacks=[]"])
    return path


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", nargs="+", required=True)
    ap.add_argument("--between", nargs=2, default=["datamodules/stream.py", "datamodules/sources.py"])
    ap.add_argument("--root", type=Path, default=ROOT)
    ap.add_argument("--batch", type=int, default=2, help="which training batch to trace (1 = the first)")
    args = ap.parse_args(argv)
    path = trace(args.config, args.root.resolve(), args.batch)
    a, b = args.between
    pair = [p for p in path if p in (a, b)]
    crossings = sum(1 for x, y in zip(pair, pair[1:]) if x != y)
    files = sorted(set(path))
    plumbing = [p for p in path if not p.startswith(WORK)]
    plumbing = [p for i, p in enumerate(plumbing) if i == 0 or plumbing[i - 1] != p]
    print("plumbing path:", " -> ".join(plumbing))
    print(f"{len(files)} files, {len(path) - 1} hops in all; plumbing {len(set(plumbing))} files, "
          f"{len(plumbing) - 1} hops; {crossings} crossings {a} <-> {b}")
    out = {"config": args.config, "files": len(files), "hops": len(path) - 1, "plumbing_files": len(set(plumbing)),
           "plumbing_hops": len(plumbing) - 1, "crossings": crossings, "between": [a, b], "plumbing": plumbing}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
