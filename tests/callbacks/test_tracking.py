"""RolloutTracker: per-source statistics by hand, advantage sources, schedule, sample tables, one e2e fit."""

import json
from pathlib import Path
from types import SimpleNamespace

import mlflow
import pytest
import torch
import yaml
from lightning.pytorch.loggers.logger import DummyLogger

from callbacks.tracking import RolloutTracker, rollout_samples, rollout_source_stats
from lit_rl.algorithms.advantages import SourceSpecific
from lit_rl.batch import RolloutBatch
from lit_rl.tasks.base import Example

ROOT = Path(__file__).resolve().parents[2]


def batch_of(rewards, source, group, lengths, hit, L=8):
    N = len(rewards)
    return RolloutBatch(
        input_ids=torch.zeros(N, 2 + L, dtype=torch.long),
        attention_mask=torch.ones(N, 2 + L, dtype=torch.long),
        prompt_len=2,
        completion_mask=torch.ones(N, L, dtype=torch.bool),
        lengths=torch.tensor(lengths),
        rewards=torch.tensor(rewards, dtype=torch.float32),
        source=torch.tensor(source),
        group=torch.tensor(group),
        texts=[f"c{i}" for i in range(N)],
        prompt_ids=[f"p{g}" for g in group],
        hit_limit=torch.tensor(hit),
    )


# one prompt group: 4 on-policy (rewards 1, 0, 0, 1), 2 external (1, 0.5)
RO = batch_of(
    rewards=[1.0, 0.0, 0.0, 1.0, 1.0, 0.5],
    source=[0, 0, 0, 0, 1, 1],
    group=[0, 0, 0, 0, 0, 0],
    lengths=[8, 3, 8, 5, 6, 4],
    hit=[True, False, True, False, False, False],
)


def test_source_stats_by_hand_with_source_specific_advantages():
    adv, keep = SourceSpecific()(RO.rewards, RO.source, RO.group)
    s = rollout_source_stats(RO, adv, keep)
    on, ext = s["on_policy"], s["external"]
    assert set(s) == {"on_policy", "external"}
    assert on["count"] == 4 and on["kept"] == 4
    assert (on["length_mean"], on["length_min"], on["length_max"]) == (6.0, 3.0, 8.0)  # (8+3+8+5)/4
    assert on["hit_limit_frac"] == 0.5
    assert on["reward_mean"] == 0.5 and on["reward_std"] == pytest.approx(0.5)  # population std of 1,0,0,1
    # Eq. 9: on-policy centred within its group (±0.5), external A = r
    assert on["advantage_mean"] == pytest.approx(0.0) and on["advantage_std"] == pytest.approx(0.5)
    assert ext["advantage_mean"] == pytest.approx(0.75) and ext["advantage_std"] == pytest.approx(0.25)
    assert (ext["length_min"], ext["length_max"], ext["hit_limit_frac"]) == (4.0, 6.0, 0.0)


def test_advantage_stats_skip_dropped_rows_and_continuations_are_reported():
    ro = batch_of([1.0, 0.0, 1.0, 0.0], [0, 0, 2, 2], [0, 0, 0, 0], [2, 4, 6, 8], [False] * 4)
    keep = torch.tensor([True, True, False, True])
    adv = torch.tensor([0.5, -0.5, 9.0, 2.0])
    s = rollout_source_stats(ro, adv, keep)
    assert s["continuation"]["count"] == 2 and s["continuation"]["kept"] == 1
    assert s["continuation"]["advantage_mean"] == 2.0 and s["continuation"]["length_mean"] == 7.0
    assert "advantage_mean" not in rollout_source_stats(ro)["on_policy"]  # no advantages given


def test_tracker_reads_the_rows_own_advantages():
    # the advantages the module's processors set on the rows; none (SFT) -> statistics without advantages
    tr = RolloutTracker()
    adv, keep = SourceSpecific()(RO.rewards, RO.source, RO.group)
    got, got_keep = tr.advantages_of(RO.with_advantages(adv, keep))
    assert got.tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, 1.0, 0.5]) and got_keep.all()
    assert tr.advantages_of(RO) == (None, None)


class RecordingLogger(DummyLogger):
    def __init__(self):
        super().__init__()
        self.records = []

    def log_metrics(self, metrics, step=None):
        self.records.append((step, dict(metrics)))


def test_tracker_schedule_samples_and_state(tmp_path):
    logger = RecordingLogger()
    trainer = SimpleNamespace(global_step=0, loggers=[logger], is_global_zero=True, callbacks=[], log_dir=None,
                              default_root_dir=str(tmp_path))
    module = SimpleNamespace()
    tr = RolloutTracker(every_n_batches=2, samples_every_n_batches=3, samples_per_source=1)
    # as the module's processors leave them
    rows = RO.with_advantages(*SourceSpecific()(RO.rewards, RO.source, RO.group))
    batch = SimpleNamespace(rollouts=rows, examples=[Example(id="p0", question="0310200404001043", answer="")])
    for b in range(1, 7):
        trainer.global_step = 12 * b
        tr.on_train_batch_end(trainer, module, None, batch, b - 1)
    assert [s for s, _ in logger.records] == [24, 48, 72]  # every 2nd rollout batch, at global_step
    assert logger.records[0][1]["rollouts/on_policy/length_max"] == 8.0
    assert logger.records[0][1]["rollouts/external/advantage_mean"] == pytest.approx(0.75)
    rows = [json.loads(line) for line in (tmp_path / "rollout_samples.jsonl").read_text().splitlines()]
    assert ([(r["step"], r["source"]) for r in rows]
            == [(36, "on_policy"), (36, "external"), (72, "on_policy"), (72, "external")])
    assert rows[0]["prompt"] == "0310200404001043" and rows[0]["completion"] == "c0" and rows[1]["reward"] == 1.0
    assert rows[1]["advantage"] == pytest.approx(1.0)
    copy = RolloutTracker(every_n_batches=2)
    copy.load_state_dict(tr.state_dict())
    assert copy.batches_seen == 6
    assert tr.on_train_batch_end(trainer, module, None, SimpleNamespace(), 0) is None  # no rollouts: ignored


def test_sample_rows_cut_long_text():
    rows = rollout_samples(RO, ["q" * 50], per_source=2, max_chars=10, step=3)
    assert len(rows) == 4 and rows[0]["prompt"] == "q" * 10 and rows[0]["advantage"] is None


# -- one tiny end-to-end fit through the real CLI with both callbacks ---------------------------------


def test_tiny_fit_logs_rollout_curves_passk_and_reports_to_mlflow(tmp_path):
    from lit_rl.cli import run_lightning_cli

    overlay = {
        "trainer": {
            "enable_checkpointing": True,
            "callbacks": [
                {
                    "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                    "init_args": {"dirpath": str(tmp_path / "ckpt"), "monitor": "val/sudoku/multi/pass@1",
                                  "mode": "max", "every_n_train_steps": 2, "save_top_k": 1, "filename": "best-{step}"},
                },
                {"class_path": "callbacks.FormatWarmup", "init_args": {"steps": 2, "batch_size": 4, "cache_dir": None}},
                {
                    "class_path": "callbacks.passk.PassAtKEvaluation",
                    "init_args": {
                        "configs": [
                            {"name": "multi", "generation": {"gen_length": 32, "block_length": 32, "steps": 4,
                                                             "temperature": 0.9}, "num_samples": 2},
                            {"name": "det32", "generation": {"gen_length": 32, "block_length": 32, "steps": 4,
                                                             "temperature": 0.0}},
                        ],
                        "every_n_steps": 2,
                        "subset_size": 2,
                        "batch_size": 2,
                    },
                },
                {"class_path": "callbacks.tracking.RolloutTracker", "init_args": {"samples_per_source": 1}},
            ],
        },
    }
    (tmp_path / "cb.yaml").write_text(yaml.safe_dump(overlay))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cli = run_lightning_cli([
        "fit", "--config", str(ROOT / "conf/erils.yaml"), "--config", str(ROOT / "tests/tiny_overlay.yaml"),
        "--config", str(tmp_path / "cb.yaml"), f"--trainer.default_root_dir={tmp_path}",
        f"--trainer.logger.init_args.tracking_uri={uri}",
        f"--data.init_args.pool_path={ROOT}/data/pools/sudoku_scripted.jsonl.gz",
    ])
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    run = client.search_runs([client.get_experiment_by_name("lit_rl-embedded").experiment_id])[0]
    rid = run.info.run_id
    hist = lambda k: [h.step for h in client.get_metric_history(rid, k)]  # noqa: E731
    assert hist("rollouts/on_policy/length_mean") == [2, 4] and hist("rollouts/external/reward_std") == [2, 4]
    assert hist("rollouts/on_policy/hit_limit_frac") == [2, 4] and hist("rollouts/external/advantage_std") == [2, 4]
    assert hist("val/sudoku/multi/pass_at_2") == [2, 4] and hist("val/sudoku/det32/pass_at_1") == [2, 4]
    # one step axis: the module's own metrics sit at the optimizer step too (2 batches x 2 updates), the
    # rollout batch is a metric of its own; nothing is logged under a metric named "step"
    assert (hist("train/loss") == [2, 4] and hist("train/on_policy/reward_mean") == [2, 4]
            and hist("train/grad_norm") == [2, 4])
    assert hist("val/sudoku/greedy/accuracy") == [4]  # val_check_interval 2 batches: after the 2nd, update 4
    assert [(h.step, h.value) for h in client.get_metric_history(rid, "train/rollout_batch")] == [(2, 1.0), (4, 2.0)]
    assert "step" not in run.data.metrics and "epoch" not in run.data.metrics
    arts = {a.path for a in client.list_artifacts(rid)} | {a.path for a in client.list_artifacts(rid, "eval")}
    assert {"rollout_samples.json", "eval/passk_report.md", "eval/passk_report.json", "eval/passk_table.csv"} <= arts
    rep = json.loads((tmp_path / "eval" / "passk_report.json").read_text())
    assert rep["steps"] == [2, 4] and rep["configs"]["det32"]["final"]["step"] == 4
    # the monitored ModelCheckpoint kept the step the report calls best
    ckpt = next(c for c in cli.trainer.checkpoint_callbacks if c.monitor)
    best = rep["configs"]["multi"]["best"]
    assert (best["checkpoint"] == ckpt.best_model_path
            and Path(ckpt.best_model_path).name == f"best-step={best['step']}.ckpt")
    table = json.loads(Path(client.download_artifacts(rid, "rollout_samples.json", str(tmp_path))).read_text())
    assert {"step", "source", "prompt", "completion", "reward"} <= set(table["columns"])
    assert {r[table["columns"].index("source")] for r in table["data"]} == {"on_policy", "external"}
