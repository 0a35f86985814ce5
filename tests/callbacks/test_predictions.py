"""``python -m lit_rl predict``: a checkpoint's completions for the evaluation set, as the JSONL that
``score`` reads, for both algorithms; it never rewrites the run's config or opens an MLflow run."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest
import torch

from lit_rl.cli import main, run_lightning_cli
from lit_rl.batch import PromptBatch, RolloutBatch
from lit_rl.score import score_files
from lit_rl.tasks import SudokuTask

ROOT = Path(__file__).resolve().parents[2]


def _fit(tmp_path: Path, config: str, overlay: str, *extra: str):
    return run_lightning_cli([
        "fit", "--config", str(ROOT / config), "--config", str(ROOT / overlay),
        f"--trainer.default_root_dir={tmp_path}", f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
        "--trainer.enable_checkpointing=true",
        "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
        f"--trainer.callbacks.dirpath={tmp_path}/checkpoints", "--trainer.callbacks.save_last=true", *extra,
    ])


def _runs(tmp_path: Path) -> int:
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    return sum(len(client.search_runs([e.experiment_id])) for e in client.search_experiments())


@pytest.mark.parametrize("algorithm", ["erils", "double_rollout"])
def test_predict_writes_the_checkpoints_eval_completions_for_score(algorithm, tmp_path, capsys):
    if algorithm == "erils":
        cli = _fit(tmp_path, "conf/erils.yaml", "tests/tiny_overlay.yaml",
                   f"--data.init_args.pool_path={ROOT}/data/pools/sudoku_scripted.jsonl.gz")
    else:
        cli = _fit(tmp_path, "conf/double_rollout.yaml", "tests/tiny_dr_overlay.yaml",
                   "--data.init_args.task.init_args.num_train=50")
    config_before, runs_before = (tmp_path / "config.yaml").read_bytes(), _runs(tmp_path)
    dm, module = cli.datamodule, cli.model
    expected = [dm.evaluate_batch(b, module) for b in dm.val_dataloader()]  # the trained weights, in memory
    out = tmp_path / "preds.jsonl"
    argv = ["predict", "--config", str(tmp_path / "config.yaml"), "--ckpt_path",
            str(tmp_path / "checkpoints/last.ckpt")]
    assert main(argv + ["--trainer.callbacks+=callbacks.predictions.PredictionWriter",
                        f"--trainer.callbacks.path={out}"]) == 0
    assert main(argv) == 0  # without a writer in the config, one is added: <run folder>/predictions.jsonl
    assert "completions -> " in capsys.readouterr().out
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert (tmp_path / "predictions.jsonl").read_text() == out.read_text()
    # the checkpoint's greedy completions of every eval prompt, in order, scored as the validation scores them
    assert [r["prompt_id"] for r in rows] == [e.id for e in dm._eval]
    assert [r["completion"] for r in rows] == [t for ro in expected for t in ro.texts]
    assert [r["total"] for r in rows] == [t for ro in expected for t in ro.eval_total.tolist()]
    task = "sudoku"
    scored = score_files(task, [out])
    assert scored["n"] == len(rows) and scored["total"] == sum(r["total"] for r in rows)
    assert scored["correct"] == sum(r["correct"] for r in rows)
    # a read-only use of the run: its config is not rewritten and MLflow gets no new run
    assert (tmp_path / "config.yaml").read_bytes() == config_before and _runs(tmp_path) == runs_before


def test_predict_step_records_score_the_same_as_the_module():
    # a batch whose completions are right for one puzzle and wrong for the other: the records carry the
    # evaluation's correct/total and everything score needs to recompute them
    from lit_rl.algorithms.rl_module import RLModule

    task = SudokuTask(num_train=2)
    examples = task.eval_examples()[:2]
    texts = [f"<answer>{examples[0].answer}</answer>", "<answer>1111111111111111</answer>"]
    scores = [task.evaluate(t, e) for t, e in zip(texts, examples)]
    n = len(texts)
    ro = RolloutBatch(
        input_ids=torch.zeros(n, 3, dtype=torch.long), attention_mask=torch.ones(n, 3, dtype=torch.long), prompt_len=1,
        completion_mask=torch.ones(n, 2, dtype=torch.bool), lengths=torch.full((n,), 2),
        source=torch.zeros(n, dtype=torch.long),
        rewards=torch.tensor([s.correct for s in scores], dtype=torch.float32), group=torch.arange(n), texts=texts,
        prompt_ids=[e.id for e in examples], hit_limit=torch.zeros(n, dtype=torch.bool),
        eval_total=torch.tensor([s.total for s in scores], dtype=torch.float32),
    )
    records = RLModule(torch.nn.Linear(1, 1)).predict_step(PromptBatch(examples=examples, step=0, rollouts=ro), 0)
    blanks = examples[0].meta["puzzle"].count("0")
    assert ([(r["correct"], r["total"]) for r in records]
            == [(blanks, blanks), (scores[1].correct, examples[1].meta["puzzle"].count("0"))])
    assert records[0]["puzzle"] == examples[0].meta["puzzle"] and records[0]["ground_truth"] == examples[0].answer
