"""A ModelCheckpoint without ``dirpath`` saves to ``<default_root_dir>/checkpoints`` and ``--ckpt_path last``
finds it there (what lets sibling configs change only the run folder)."""

from pathlib import Path

import yaml

from lit_rl.cli import run_lightning_cli

ROOT = Path(__file__).resolve().parents[2]


def _fit(tmp_path, max_steps, *extra):
    overlay = tmp_path / "ckpt.yaml"
    overlay.write_text(yaml.safe_dump({"trainer": {"enable_checkpointing": True, "callbacks+": [
        {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"save_last": True}}]}}))
    return run_lightning_cli([
        "fit", "--config", str(ROOT / "conf/erils.yaml"), "--config", str(ROOT / "tests/tiny_overlay.yaml"),
        "--config", str(overlay), f"--trainer.default_root_dir={tmp_path / 'run'}", f"--trainer.max_steps={max_steps}",
        f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
        f"--data.init_args.pool_path={ROOT}/data/pools/sudoku_scripted.jsonl.gz", *extra,
    ])


def test_checkpoints_go_to_the_run_folder_and_last_resumes_from_there(tmp_path):
    first = _fit(tmp_path, 4)
    assert (tmp_path / "run/checkpoints/last.ckpt").is_file()
    assert first.trainer.checkpoint_callback.dirpath == str((tmp_path / "run/checkpoints").resolve())
    resumed = _fit(tmp_path, 8, "--ckpt_path", "last")
    assert resumed.trainer.global_step == 8 and resumed.trainer.datamodule.cursor == 4  # continued, not restarted
