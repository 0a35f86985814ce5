"""PromptTask: your own prompts (local JSONL / Parquet, or a datasets builder) and rewards."""

import json
from pathlib import Path

import pytest

from lit_rl.tasks.registry import format_warmup_text
from lit_rl.tasks import PromptTask, get_task

ROOT = Path(__file__).resolve().parents[2]
SUMS = ROOT / "data/prompts/sums_eval.jsonl"


def _write(tmp_path: Path, rows, name="rows.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_local_jsonl_rows_become_examples_and_extra_columns_reach_rewards():
    task = PromptTask(train_path=str(SUMS), eval_path=str(SUMS), id_column="id")
    ex = task.eval_examples()[0]
    assert (ex.id, ex.question, ex.answer, ex.meta) == ("sum-24-5", "24+5", "29", {"carry": 0})
    assert task.messages(ex) == [{"role": "user", "content": "24+5"}]
    assert task.reward("<reasoning>4+5=9</reasoning>\n<answer> 29 </answer>", ex) == 1.0
    assert task.reward("<answer>29</answer> then <answer>30</answer>", ex) == 0.0  # the last block counts
    assert task.reward("29", ex) == 0.0
    assert task.evaluate("<answer>29</answer>", ex) == (1.0, 1.0)
    seen = {}

    def spy(prompts, completions, **kwargs):
        seen.update(kwargs)
        return [0.5] * len(completions)

    scored = PromptTask(eval_path=str(SUMS), id_column="id", reward_funcs=[spy])
    assert scored.total_reward("<answer>29</answer>", scored.eval_examples()[0]) == 1.5
    assert seen["carry"] == [0] and seen["answer"] == ["29"] and seen["prompt_id"] == ["sum-24-5"]


def test_parquet_renamed_columns_chat_prompts_and_math_check(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"problem": "Half of 1?", "solution": "\\frac{1}{2}"}, {"problem": "Two?", "solution": "2"}]
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    task = PromptTask(eval_path=str(path), prompt_column="problem", columns={"solution": "answer"}, answer_check="math")
    a, b = task.eval_examples()
    assert (a.id, a.answer) == ("prompts-eval-0", "\\frac{1}{2}")
    assert task.reward("so \\boxed{0.5}", a) == 1.0 and task.reward("\\boxed{1/3}", a) == 0.0
    chat = _write(tmp_path, [{"prompt": [{"role": "system", "content": "Be brief."},
                                         {"role": "user", "content": "1+1"}], "answer": "2"}])
    ex = PromptTask(eval_path=str(chat)).eval_examples()[0]
    assert PromptTask(eval_path=str(chat)).messages(ex)[0] == {"role": "system", "content": "Be brief."}


def test_datasets_json_builder(tmp_path):
    pytest.importorskip("datasets")
    data = _write(tmp_path, [{"prompt": "3+4", "answer": "7"}, {"prompt": "1+1", "answer": "2"}])
    task = PromptTask(dataset="json", data_files={"train": str(data)}, eval_split="train", answer_check="exact")
    assert [e.question for e in task.eval_examples()] == ["3+4", "1+1"]
    assert task.eval_examples()[1].answer == "2"


def test_no_verifier_scores_the_reward_functions(tmp_path):
    data = _write(tmp_path, [{"prompt": "say hi"}])
    task = PromptTask(eval_path=str(data), answer_check="none", answer_column=None,
                      reward_funcs=[lambda prompts, completions, **kw: [float("hi" in str(c)) for c in completions]])
    ex = task.eval_examples()[0]
    assert task.reward("hi", ex) == 0.0 and task.total_reward("hi", ex) == 1.0
    assert task.evaluate("hi", ex) == (1.0, 1.0)


def test_bad_rows_and_options_name_the_file_line_and_column(tmp_path):
    bad = _write(tmp_path, [{"prompt": "1+1", "answer": "2"}, {"question": "2+2", "answer": "4"}])
    with pytest.raises(ValueError, match=r"rows.jsonl:2: no column 'prompt' \(prompt_column"):
        PromptTask(eval_path=str(bad)).eval_examples()
    no_answer = _write(tmp_path, [{"prompt": "1+1"}], "na.jsonl")
    with pytest.raises(ValueError, match=r"na.jsonl:1: no column 'answer'"):
        PromptTask(eval_path=str(no_answer)).eval_examples()
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        PromptTask(train_path=str(tmp_path / "missing.jsonl")).train_examples()
    with pytest.raises(ValueError, match="answer_check"):
        PromptTask(eval_path=str(bad), answer_check="fuzzy")
    with pytest.raises(ValueError, match="no train data"):
        PromptTask(eval_path=str(bad)).train_examples()
    empty = _write(tmp_path, [{"prompt": "1+1", "answer": "2"}, {"prompt": "  ", "answer": "4"}], "empty.jsonl")
    with pytest.raises(ValueError, match=r"empty.jsonl:2: column 'prompt' is empty: a prompt without text"):
        PromptTask(train_path=str(empty)).train_examples()  # was trained on without a word
    chat = _write(tmp_path, [{"prompt": [{"role": "user", "content": ""}], "answer": "2"}], "chat.jsonl")
    with pytest.raises(ValueError, match=r"chat.jsonl:1: column 'prompt' is empty"):
        PromptTask(train_path=str(chat)).train_examples()


def test_registry_score_records_and_format_warmup():
    import random

    task = get_task("prompts")  # score builds tasks by name; records carry question and ground truth
    ex = task.example_from_record("2+2", "4", index=3)
    assert (ex.id, ex.answer) == ("prompts-record-3", "4")
    assert task.reward("<answer>4</answer>", ex) == 1.0
    text = format_warmup_text("prompts", ex, random.Random(0))
    assert (text.startswith("<reasoning>") and text.endswith("</answer>")
            and len(text.split("<answer>")[1]) == 1 + len("</answer>"))


def test_cli_trains_on_a_local_file_with_a_trl_reward(tmp_path):
    pytest.importorskip("trl")
    import mlflow

    from lit_rl.cli import run_lightning_cli

    cli = run_lightning_cli([
        "fit", "--config", str(ROOT / "conf/prompts.yaml"), "--config", str(ROOT / "tests/tiny_overlay.yaml"),
        f"--trainer.default_root_dir={tmp_path}", f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
        f"--data.init_args.task.init_args.train_path={ROOT}/data/prompts/sums_train.jsonl",
        f"--data.init_args.task.init_args.eval_path={ROOT}/data/prompts/sums_eval.jsonl",
        "--data.init_args.task.init_args.reward_funcs=[trl.rewards.think_format_reward]",
    ])
    assert cli.trainer.global_step == 4
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    run = client.search_runs([client.get_experiment_by_name("lit_rl-prompts").experiment_id])[0]
    assert ({"rewards/think_format_reward/mean", "rewards/prompts_reward/mean", "val/prompts/greedy/accuracy"}
            <= set(run.data.metrics))
    assert run.data.params["data.init_args.task.class_path"] == "lit_rl.tasks.PromptTask"


def test_math_verify_check(tmp_path):
    pytest.importorskip("math_verify")
    data = _write(tmp_path, [{"prompt": "Half of one?", "answer": "\\frac{1}{2}"}])
    task = PromptTask(eval_path=str(data), answer_check="math_verify")
    ex = task.eval_examples()[0]
    assert task.reward("so it is \\boxed{0.5}", ex) == 1.0
    assert task.reward("\\boxed{1/3}", ex) == 0.0
    assert task.reward("no answer at all " * 50, ex) == 0.0


def test_the_answer_column_reaches_rewards_under_its_own_name_too(tmp_path):
    """TRL passes every dataset column by its name: f(completions, solution, **kw) used to get a TypeError because
    the answer column arrived only as ``answer``."""
    data = _write(tmp_path, [{"prompt": "1+1", "solution": "2"}])

    def trl_style(completions, solution, **kwargs):
        return [float(c[0]["content"].strip() == s) for c, s in zip(completions, solution)]

    task = PromptTask(train_path=str(data), answer_column="solution", reward_funcs=[trl_style])
    ex = task.train_examples()[0]
    assert task.reward_kwargs([ex])["solution"] == ["2"] == task.reward_kwargs([ex])["answer"]
    assert task.total_rewards(["2"], [ex]).per_func["trl_style"] == [1.0]
