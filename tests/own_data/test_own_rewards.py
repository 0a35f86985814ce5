"""examples/own_rewards.py and the template that uses it, conf/real/own_data.yaml: your JSONL and your reward on
the real model. The reward by hand; the template's resolved task (nothing of the base's WordProblemTask carried
over); one real GRPO update on SmolLM2 where it is prepared (tests/support/real_model.py), the reward reaching the
completions under the data file's own column names."""

from __future__ import annotations

import json

import pytest
import yaml

from examples.own_rewards import final_number
from support.real_model import ROOT, prepared_or_skip


def _msg(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def test_final_number_reads_the_stated_answer_else_the_last_number():
    completions = [_msg("Ana has 9 - 6 = 3 shells."), _msg("3 shells, then 4"), _msg("no number"), "-2", _msg(""),
                   _msg("So the answer is 11. Next, 4 + 5 = 9"), _msg("#### 16\nThen 2 more")]
    assert final_number(completions, solution=[3, 3, 3, -2, 0, 11, 2]) == [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0]


def test_the_sample_data_are_the_columns_the_template_names():
    rows = [json.loads(line) for line in (ROOT / "data/prompts/word_problems_train.jsonl").read_text().splitlines()]
    evals = (ROOT / "data/prompts/word_problems_eval.jsonl").read_text().splitlines()
    assert len(rows) == 1000 and len(evals) == 128 and set(rows[0]) == {"id", "prompt", "solution", "kind"}
    assert len({r["id"] for r in rows}) == 1000 and {r["kind"] for r in rows} == {"add", "sub", "two_step"}
    assert not {r["prompt"] for r in rows} & {json.loads(line)["prompt"] for line in evals}  # held out


def test_the_template_resolves_to_prompttask_with_nothing_of_the_base_task(capsys):
    from lit_rl.cli import main

    with pytest.raises(SystemExit):
        main(["fit", "--config", str(ROOT / "conf/real/grpo_smollm2.yaml"),
              "--config", str(ROOT / "conf/real/own_data.yaml"), "--print_config"])
    task = yaml.safe_load(capsys.readouterr().out)["data"]["init_args"]["task"]
    assert task["class_path"] == "lit_rl.tasks.PromptTask"
    assert task["init_args"]["reward_funcs"] == ["examples.own_rewards.final_number"]
    assert task["init_args"]["question_template"] is None and task["init_args"]["answer_check"] == "none"


def test_one_real_update_on_your_data_and_reward(tmp_path, monkeypatch):
    from lit_rl.cli import main

    folder = prepared_or_skip()
    monkeypatch.setenv("LIT_RL_MODELS", str(folder.parent))
    monkeypatch.chdir(ROOT)  # the template's data paths and examples.own_rewards are relative to the repository
    run = tmp_path / "run"
    overlay = tmp_path / "small.yaml"
    overlay.write_text(yaml.safe_dump({
        "threads": 1,
        "trainer": {"max_steps": 1, "num_sanity_val_steps": 0, "enable_progress_bar": False,
                    "default_root_dir": str(run), "enable_checkpointing": False,
                    "logger": {"class_path": "lit_rl.loggers.MLFlowLogger", "init_args": {
                        "experiment_name": "own", "tracking_uri": f"sqlite:///{tmp_path}/mlflow.db"}},
                    "callbacks": [{"class_path": "callbacks.RolloutTracker"},
                                  {"class_path": "callbacks.PromptLedger"}]},
        "data": {"init_args": {"prompts_per_batch": 2, "num_generations": 2, "eval_size": 2, "eval_batch_size": 2,
                               "generation": {"max_new_tokens": 16, "temperature": 1.0},
                               "eval_generation": {"max_new_tokens": 16, "temperature": 0.0}}},
    }))
    assert main(["fit", "--config", "conf/real/grpo_smollm2.yaml", "--config", "conf/real/own_data.yaml",
                 "--config", str(overlay)]) == 0
    import mlflow

    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (r,) = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert "rewards/final_number/mean" in r.data.metrics, sorted(r.data.metrics)  # TRL's name for it
    assert r.info.status == "FINISHED"
    ledger = [json.loads(line) for line in (run / "consumed_prompts.jsonl").read_text().splitlines()]
    assert all(pid.startswith("word-train-") for rec in ledger for pid in rec["prompt_ids"])  # the file's own ids
