"""PassAtKEvaluation: schedule, table/report contents, ModelCheckpoint on its metric, resume, validate CLI.

Most tests drive a real ``lightning.Trainer`` with a stub policy whose completions are known: at optimizer
step ``s`` the completion of prompt ``i`` under seed ``1001 + j`` is the solution iff ``i < N[s] + j``
(otherwise no answer), so every Pass@k is known by hand.
"""

import json
from pathlib import Path

import lightning as L
import mlflow
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import MLFlowLogger
from torch.utils.data import DataLoader

from callbacks.passk import PassAtKEvaluation, mlflow_metric_name
from lit_rl.evaluation import EvalConfig
from lit_rl.generation.settings import DecodeSettings
from lit_rl.tasks import get_task

ROOT = Path(__file__).resolve().parents[2]
SOLVED = {0: 0, 4: 1, 8: 3, 12: 2}  # prompts solved by seed 1001 at each step (others: N[s] + j for seed j)


class StepPolicy(torch.nn.Module):
    """Completions depend on ``self.step`` (set by the module after its updates), the prompt and the seed."""

    eos_id = 0

    def __init__(self, examples):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))
        self.questions = [e.question for e in examples]
        self.answers = {e.question: "<answer>" + e.answer + "</answer>" for e in examples}
        self.step = 0
        self.generate_calls: list[int] = []  # self.step at each generate call

    def encode_prompts(self, messages, max_prompt_len=None):
        ids = torch.tensor([[self.questions.index(m[-1]["content"])] for m in messages])
        return ids, torch.ones_like(ids)

    def generate(self, prompt_ids, prompt_mask, settings, seed):
        self.generate_calls.append(self.step)
        B = prompt_ids.shape[0]
        return torch.stack([prompt_ids[:, 0], torch.full((B,), seed), torch.full((B,), self.step),
                            torch.zeros(B, dtype=torch.long)], 1)

    def completion_lengths(self, comp):
        return torch.full((comp.shape[0],), 4)

    def decode_completions(self, comp):
        out = []
        for i, seed, step, _ in comp.tolist():
            solved = SOLVED.get(step, 0) + (seed - 1001)
            out.append(self.answers[self.questions[i]] if i < solved else "no answer")
        return out


class StubModule(L.LightningModule):
    """μ manual optimizer updates per batch (like ERILS), so global_step jumps by μ per rollout batch."""

    def __init__(self, policy, updates_per_batch=2):
        super().__init__()
        self.automatic_optimization = False
        self.policy = policy
        self.updates_per_batch = updates_per_batch

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        for _ in range(self.updates_per_batch):
            opt.zero_grad()
            self.manual_backward((self.policy.w ** 2).sum())
            opt.step()
        self.policy.step = self.global_step

    def validation_step(self, batch, batch_idx):
        pass

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)  # weights unchanged: outputs depend on step only


class StubData(L.LightningDataModule):
    def __init__(self, task):
        super().__init__()
        self.task = task
        self.max_prompt_len = None

    def train_dataloader(self):
        return DataLoader(torch.zeros(1000, 1), batch_size=1)

    def val_dataloader(self):
        return DataLoader(torch.zeros(1, 1), batch_size=1)


def sudoku():
    return get_task("sudoku", num_train=2, system_prompt="", question_template="{puzzle}")


def configs():
    return [
        EvalConfig(name="multi", generation=DecodeSettings(32, 32, 16, 0.9), num_samples=2),
        EvalConfig(name="det", generation=DecodeSettings(32, 32, 16, 0.0)),
    ]


def make_cb(**kw):
    kw = {"configs": configs(), "every_n_steps": 4, "subset_size": 4, "batch_size": 2, **kw}
    return PassAtKEvaluation(**kw)


def fit(tmp_path, cb, max_steps=12, mu=2, callbacks=(), logger=False, ckpt_path=None, task=None):
    task = task or sudoku()
    policy = StepPolicy(task.eval_examples()[:4])
    module = StubModule(policy, mu)
    trainer = L.Trainer(
        max_steps=max_steps, accelerator="cpu", devices=1, logger=logger, callbacks=[cb, *callbacks],
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, default_root_dir=tmp_path,
        enable_checkpointing=bool(callbacks), num_sanity_val_steps=0,
    )
    trainer.fit(module, datamodule=StubData(task), ckpt_path=ckpt_path)
    return trainer, module, policy


def expected_pass(step: int, k: int) -> float:
    """Pooled best-of-k over blank cells for the first 4 SPG test puzzles at ``step``."""
    blanks = [e.meta["puzzle"].count("0") for e in sudoku().eval_examples()[:4]]
    solved = min(SOLVED.get(step, 0) + k - 1, 4)
    return sum(blanks[:solved]) / sum(blanks)


# -- schedule ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mu, kwargs, max_steps, steps",
    [
        (2, {"start_step": 4, "eval_at_start": True}, 12, [0, 4, 8, 12]),  # end == last scheduled: no repeat
        (3, {}, 12, [6, 9, 12]),  # global_step 3, 6, 9, 12: first batch past 4, 8, 12
        (2, {"start_step": 8}, 14, [8, 12, 14]),  # 14: eval_at_end
        (2, {"start_step": 8, "eval_at_end": False}, 14, [8, 12]),
    ],
)
def test_schedule_fires_at_the_right_steps(tmp_path, mu, kwargs, max_steps, steps):
    cb = make_cb(**kwargs)
    trainer, _, policy = fit(tmp_path, cb, max_steps=max_steps, mu=mu)
    assert trainer.global_step == max_steps
    assert cb.table.steps == steps
    # one generate call per (config seed, batch): (2 + 1) seeds x 2 batches per evaluation
    assert policy.generate_calls == [s for s in steps for _ in range(6)]


# -- table, report, MLflow, ModelCheckpoint ----------------------------------------------------------


def test_table_report_mlflow_and_model_checkpoint_pick_the_best_step(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    logger = MLFlowLogger(experiment_name="passk", tracking_uri=uri)
    ckpt = ModelCheckpoint(
        dirpath=tmp_path / "ckpt", monitor="val/sudoku/det/pass@1", mode="max", every_n_train_steps=4, save_top_k=1,
        filename="{step}",
    )
    cb = make_cb()
    trainer, _, _ = fit(tmp_path, cb, callbacks=[ckpt], logger=logger)

    # values by hand: det pass@1 = blanks of the prompts solved by seed 1001; multi pass@2 one more prompt
    for step in (4, 8, 12):
        det, multi = cb.table.metrics_at(step, "det"), cb.table.metrics_at(step, "multi")
        assert det["pass@1"] == pytest.approx(expected_pass(step, 1))
        assert multi["pass@1"] == pytest.approx(expected_pass(step, 1))
        assert multi["pass@2"] == pytest.approx(expected_pass(step, 2))
        assert multi["accuracy"] == pytest.approx((expected_pass(step, 1) + expected_pass(step, 2)) / 2)
    assert expected_pass(8, 1) > expected_pass(12, 1) > expected_pass(4, 1)  # best at 8, final 12

    # ModelCheckpoint saw the metric at the same batch end and kept step 8
    assert Path(ckpt.best_model_path).name == "step=8.ckpt"
    assert torch.load(ckpt.best_model_path, weights_only=False)["global_step"] == 8
    assert float(ckpt.best_model_score) == pytest.approx(expected_pass(8, 1))

    # files: the table across checkpoints and the App. D report
    out = Path(tmp_path) / "eval"
    csv_rows = (out / "passk_table.csv").read_text().splitlines()
    assert csv_rows[0] == "step,config,metric,value" and sum(r.startswith("8,det,pass@1,") for r in csv_rows) == 1
    rep = json.loads((out / "passk_report.json").read_text())
    assert rep["configs"]["det"]["best"]["step"] == 8 and rep["configs"]["det"]["final"]["step"] == 12
    assert rep["configs"]["det"]["best"]["checkpoint"] == ckpt.best_model_path
    assert rep["configs"]["multi"]["best"]["step"] == 8
    assert rep["configs"]["multi"]["seeds"] == [1001, 1002] and rep["configs"]["det"]["parser"] == "eval"
    assert rep["configs"]["multi"]["settings"]["temperature"] == 0.9
    md = (out / "passk_report.md").read_text()
    assert f"| det | best (`{ckpt.best_model_path}`) | 8 | pass@1 {expected_pass(8, 1):.4f}" in md
    assert (out / "samples" / "passk_step_000008.jsonl").exists()

    # MLflow: metrics at their steps ('@' is not allowed there) and the artifacts
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    hist = client.get_metric_history(logger.run_id, mlflow_metric_name("val/sudoku/det/pass@1"))
    assert [(h.step, round(h.value, 6)) for h in hist] == [(s, round(expected_pass(s, 1), 6)) for s in (4, 8, 12)]
    arts = {a.path for a in client.list_artifacts(logger.run_id, "eval")}
    assert {"eval/passk_table.csv", "eval/passk_table.md", "eval/passk_report.md", "eval/passk_report.json"} <= arts


# -- state -------------------------------------------------------------------------------------------


def test_state_round_trip_and_resume_continues_the_table(tmp_path):
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, every_n_train_steps=4)
    cb = make_cb()
    fit(tmp_path, cb, max_steps=8, callbacks=[ckpt])
    assert cb.table.steps == [4, 8]
    copy = make_cb()
    copy.load_state_dict(cb.state_dict())
    assert copy.table.rows == cb.table.rows and copy.last_step == 8

    resumed = make_cb()
    _, _, policy = fit(tmp_path, resumed, max_steps=12, callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpt2")],
                       ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    assert resumed.table.steps == [4, 8, 12]  # restored rows + the new evaluation, step 8 not repeated
    assert set(policy.generate_calls) == {12}
    assert resumed.table.metrics_at(4, "det") == cb.table.metrics_at(4, "det")
    rep = json.loads((tmp_path / "eval" / "passk_report.json").read_text())
    assert rep["configs"]["det"]["best"]["step"] == 8 and rep["configs"]["det"]["final"]["step"] == 12


def test_validate_evaluates_a_checkpoint_at_its_step(tmp_path):
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, every_n_train_steps=4)
    fit(tmp_path, make_cb(eval_at_end=False), max_steps=8, callbacks=[ckpt])
    task = sudoku()
    policy = StepPolicy(task.eval_examples()[:4])
    policy.step = 8  # what the checkpointed weights produce
    cb = make_cb()
    trainer = L.Trainer(accelerator="cpu", logger=False, callbacks=[cb], enable_progress_bar=False,
                        default_root_dir=tmp_path / "val")
    trainer.validate(StubModule(policy), datamodule=StubData(task), ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    assert cb.last_eval_step == 8
    assert cb.last_metrics["val/sudoku/det/pass@1"] == pytest.approx(expected_pass(8, 1))
    assert trainer.callback_metrics["val/sudoku/multi/pass@2"] == pytest.approx(expected_pass(8, 2))
    assert (tmp_path / "val" / "eval" / "passk_validate_table.csv").exists()
    # validate results go to their own table; the training table (restored from the checkpoint) is untouched
    assert cb.table.steps == [4, 8] and cb._stage_table("validate").steps == [8]


# -- validate through the CLI: same weights, same numbers --------------------------------------------


def test_cli_validate_twice_gives_identical_numbers_and_completions(tmp_path):
    from lit_rl.cli import run_lightning_cli

    overlay = {
        "trainer": {
            "logger": False,
            "callbacks": [{
                "class_path": "callbacks.passk.PassAtKEvaluation",
                "init_args": {
                    "configs": [
                        {"name": "multi", "generation": {"gen_length": 32, "block_length": 32, "steps": 8,
                                                         "temperature": 0.9}, "num_samples": 2},
                        {"name": "det32", "generation": {"gen_length": 32, "block_length": 32, "steps": 8,
                                                         "temperature": 0.0}},
                    ],
                    "subset_size": 3,
                    "batch_size": 2,
                    "num_logged_samples": 3,
                },
            }],
        },
        "data": {"init_args": {"eval_size": 1, "eval_batch_size": 1}},
    }
    (tmp_path / "eval.yaml").write_text(yaml.safe_dump(overlay))
    results = []
    for run in ("a", "b"):
        cli = run_lightning_cli([
            "validate", "--config", str(ROOT / "conf/erils.yaml"), "--config", str(ROOT / "tests/tiny_overlay.yaml"),
            "--config", str(tmp_path / "eval.yaml"), f"--trainer.default_root_dir={tmp_path / run}",
            f"--data.init_args.pool_path={ROOT}/data/pools/sudoku_scripted.jsonl.gz",
        ])
        cb = next(c for c in cli.trainer.callbacks if isinstance(c, PassAtKEvaluation))
        samples = (tmp_path / run / "eval" / "samples" / "passk_validate_step_000000.jsonl").read_text()
        results.append((cb.last_metrics, samples))
    (m_a, s_a), (m_b, s_b) = results
    assert set(m_a) >= {"val/sudoku/multi/pass@1", "val/sudoku/multi/pass@2", "val/sudoku/det32/pass@1"}
    assert m_a == m_b and s_a == s_b
    rows = [json.loads(line) for line in s_a.splitlines()]
    multi = {(r["prompt_id"], r["seed"]): r["completion"] for r in rows if r["config"] == "multi"}
    assert len(multi) == 6
    # the seeds matter (T 0.9): different seeds give different completions for some prompt
    assert any(multi[(p, 1001)] != multi[(p, 1002)] for p, _ in multi)


def test_a_named_evaluation_writes_its_own_files_beside_the_default_one():
    from callbacks.passk import PassAtKEvaluation
    from lit_rl.errors import FieldError

    assert PassAtKEvaluation()._stem("fit") == "passk" and PassAtKEvaluation()._stem("validate") == "passk_validate"
    named = PassAtKEvaluation(name="lengths")
    assert named._stem("fit") == "passk_lengths" and named._stem("validate") == "passk_lengths_validate"
    with pytest.raises(FieldError, match="name") as e:
        PassAtKEvaluation(name="../x")
    assert "'../x'" in str(e.value)


def test_a_named_evaluation_has_its_own_state_key_and_an_unnamed_one_keeps_the_old_key():
    """An eval overlay (conf/eval/paper.yaml: name paper) appended beside a config's own Pass@k with the same
    configurations: Lightning refuses two stateful callbacks with one key; the unnamed key is the one older
    checkpoints hold."""
    from lightning.pytorch.trainer.connectors.callback_connector import _validate_callbacks_list

    own, overlay = PassAtKEvaluation(every_n_steps=100), PassAtKEvaluation(every_n_steps=100, name="paper")
    configs = [c.name for c in own.configs]
    assert own.state_key == f"PassAtKEvaluation{{'configs': {configs}, 'every_n_steps': 100}}"
    assert overlay.state_key != own.state_key and "'name': 'paper'" in overlay.state_key
    _validate_callbacks_list([own, overlay])  # no "more than one stateful callback"
    with pytest.raises(RuntimeError, match="more than one"):
        _validate_callbacks_list([own, PassAtKEvaluation(every_n_steps=100)])
