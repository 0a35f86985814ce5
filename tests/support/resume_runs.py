"""The short ERILS fit the resume tests start from: its command line and a copy of a finished run
(tests/robustness/test_resume_truth.py, tests/test_resume.py; the shared run: ``resume_base`` in tests/conftest.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
MU = 2  # updates per rollout batch


def run_args(run: Path, max_steps: int, *extra: str, callbacks: tuple = (),
             config: str = "conf/erils.yaml") -> list[str]:
    """``python -m lit_rl fit`` on ``config`` + the tiny overlay, checkpoints every 4 updates, a local MLflow store."""
    overlay = run / "overlay.yaml"
    run.mkdir(parents=True, exist_ok=True)
    overlay.write_text(yaml.safe_dump({
        "trainer": {
            "enable_checkpointing": True, "enable_progress_bar": False, "default_root_dir": str(run),
            "logger": {"class_path": "lit_rl.loggers.MLFlowLogger", "init_args": {
                "experiment_name": "truth", "tracking_uri": f"sqlite:///{run}/mlflow.db",
                "spill_dir": str(run / "unsent")}},
            "callbacks": [
                {"class_path": "callbacks.FormatWarmup", "init_args": {"steps": 2, "batch_size": 4, "cache_dir": None}},
                {"class_path": "callbacks.ExactResume"}, {"class_path": "callbacks.PromptLedger"},
                {"class_path": "callbacks.CheckpointOnSigterm"},
                {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                 "init_args": {"dirpath": str(run / "checkpoints"), "save_last": True, "every_n_train_steps": 4}},
                *callbacks],
        },
        "model": {"init_args": {"updates_per_batch": MU}},
    }))
    data = ([f"--data.init_args.pool_path={ROOT}/data/pools/sudoku_scripted.jsonl.gz"]
            if config == "conf/erils.yaml" else [])
    return ["fit", "--config", str(ROOT / config), "--config", str(ROOT / "tests/tiny_overlay.yaml"),
            "--config", str(overlay), f"--trainer.max_steps={max_steps}", *data, *extra]



def run_cli(argv: list[str]) -> tuple[int, str]:
    """``python -m lit_rl`` in this process with its stdout silenced: (exit status, stderr)."""
    import contextlib
    import io

    from lit_rl.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    return rc, err.getvalue()


def copy_run(base: Path, dst: Path) -> Path:
    """The base run in a new folder, its checkpoints' own paths kept (as after ``cp -r`` of a run)."""
    shutil.copytree(base, dst)
    return dst


def fit_base(folder: Path) -> Path:
    """A run stopped at update 4 (two rollout batches): periodic ``epoch=0-step=4.ckpt`` and ``last.ckpt``."""
    from lit_rl.cli import main

    run = folder / "base"
    assert main(run_args(run, 4)) == 0
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["epoch=0-step=4.ckpt", "last.ckpt"]
    return run
