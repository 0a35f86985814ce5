"""``validate`` on a fit's checkpoint: its MLflow run is marked as that checkpoint's evaluation, logs at the
checkpoint's step, names the fit's run, and ``report`` does not draw it as a second training variant."""

from __future__ import annotations

from pathlib import Path

from mlflow.tracking import MlflowClient

from lit_rl.cli import run_lightning_cli
from lit_rl.report import load_runs

ROOT = Path(__file__).resolve().parents[1]


def test_validate_logs_an_evaluation_run_at_the_checkpoints_step(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    common = ["--config", str(ROOT / "conf/erils.yaml"), "--config", str(ROOT / "tests/tiny_overlay.yaml"),
              f"--trainer.default_root_dir={tmp_path}", f"--trainer.logger.init_args.tracking_uri={uri}",
              "--trainer.logger.init_args.experiment_name=e"]
    fit = run_lightning_cli(["fit", *common, "--trainer.enable_checkpointing=true"])
    fit_run = fit.trainer.logger.run_id
    (ckpt,) = (tmp_path / "checkpoints").glob("*.ckpt")
    run_lightning_cli(["validate", *common, f"--ckpt_path={ckpt}"])

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("e")
    runs = {r.info.run_id: r for r in client.search_runs([exp.experiment_id])}
    assert len(runs) == 2
    (ev,) = [r for r in runs.values() if r.info.run_id != fit_run]
    tags = ev.data.tags
    assert tags["lit_rl.role"] == "evaluation" and tags["lit_rl.stage"] == "validate"
    assert tags["lit_rl.evaluates"] == fit_run and tags["lit_rl.checkpoint"] == str(ckpt)
    assert tags["lit_rl.checkpoint_step"] == "4" and ev.info.run_name.endswith("[validate @ step 4]")
    val_keys = [k for k in ev.data.metrics if k.startswith("val/")]
    assert val_keys
    for k in val_keys:  # at the checkpoint's step, where the fit's own curves are; Lightning logged step 0
        assert {m.step for m in client.get_metric_history(ev.info.run_id, k)} == {4}, k
    assert [r.run_id for r in load_runs(uri, experiments=["e"])] == [fit_run]  # report: one training variant

    # --ckpt_path last: the checkpoint fit would resume from (Lightning's own "last" wants last*.ckpt and, with
    # none, validated the config's initial weights under this run's name); the values are the fit's final ones
    val = run_lightning_cli(["validate", *common, "--ckpt_path=last"])
    (ev2,) = [r for r in client.search_runs([exp.experiment_id]) if r.info.run_id not in runs]
    assert ev2.data.tags["lit_rl.checkpoint"] == str(ckpt) and ev2.data.tags["lit_rl.checkpoint_step"] == "4"
    acc = "val/sudoku/greedy/accuracy"
    assert float(val.trainer.callback_metrics[acc]) == runs[fit_run].data.metrics[acc]

    # a run the config names (here the fit's own): values at the checkpoint's step, no evaluation tags
    run_lightning_cli(["validate", *common, f"--trainer.logger.init_args.run_id={fit_run}", f"--ckpt_path={ckpt}"])
    assert "lit_rl.role" not in client.get_run(fit_run).data.tags
    assert {m.step for m in client.get_metric_history(fit_run, acc)} == {4}
