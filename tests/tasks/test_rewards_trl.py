"""TRL's own reward functions plug into lit_rl tasks: keyword calls, conversational completions,
completion ids, reward_weights, per-function metrics, and a CLI training run that logs them."""

import math
from pathlib import Path

import mlflow
import pytest

from lit_rl.tasks import SudokuTask
from lit_rl.tasks.rewards import call_reward_func

trl_rewards = pytest.importorskip("trl.rewards")
ROOT = Path(__file__).resolve().parents[2]


def _sudoku(**kw):
    task = SudokuTask(num_train=0, **kw)
    ex = task.eval_examples()[0]
    return task, ex


def test_think_format_reward_gets_conversational_completions():
    task, ex = _sudoku(reward_funcs=["trl.rewards.think_format_reward"])
    right = f"<answer>{ex.answer}</answer>"
    texts = [f"<think>\nfill the blanks\n</think>\n{right}", right]  # TRL: 1.0 only with a think block
    scores = task.total_rewards(texts, [ex, ex])
    assert scores.per_func["think_format_reward"] == [1.0, 0.0]
    assert scores.per_func["sudoku_reward"] == [1.0, 1.0]
    assert scores.totals == [2.0, 1.0]
    # TRL's per-function metric names; std is the sample std over the batch (TRL's torch.std)
    m = scores.metrics()
    assert m["rewards/think_format_reward/mean"] == 0.5
    assert m["rewards/think_format_reward/std"] == pytest.approx(math.sqrt(0.5))


def test_soft_overlong_punishment_reads_completion_ids_and_weights_apply():
    # max 10, cache 5: length 4 -> 0; length 7 -> (10 - 5 - 7) / 5 = -0.4; length 12 -> -1; weight 0.5 halves them
    punish = trl_rewards.get_soft_overlong_punishment(max_completion_len=10, soft_punish_cache=5)
    task, ex = _sudoku(reward_funcs=[punish], reward_weights=[0.5])
    ids = [[1] * 4, [1] * 7, [1] * 12]
    scores = task.total_rewards(["x", "y", "z"], [ex] * 3, completion_ids=ids)
    name = type(punish).__name__ if not hasattr(punish, "__name__") else punish.__name__
    assert scores.per_func[name] == pytest.approx([0.0, -0.4, -1.0])
    assert scores.totals == pytest.approx([0.0, -0.2, -0.5])  # "x", "y", "z" score 0 on the verifier


def test_none_adds_nothing_and_older_positional_functions_still_work():
    def legacy(p, c, **kw):  # lit_rl's older positional form, other parameter names
        return [len(p[0]) > 0 and 0.25 for _ in c]

    def skip_second(prompts, completions):  # no **kwargs: gets only what it names
        return [1.0, None]

    task, ex = _sudoku(reward_funcs=[legacy, skip_second], reward_completions="text")
    scores = task.total_rewards(["a", "b"], [ex, ex])
    assert scores.per_func["legacy"] == [0.25, 0.25]
    assert math.isnan(scores.per_func["skip_second"][1])
    assert scores.totals == [1.25, 0.25]  # NaN adds nothing (TRL's nansum)
    assert scores.metrics()["rewards/skip_second/mean"] == 1.0  # NaN rows left out


def test_bad_reward_setups_name_the_field():
    with pytest.raises(ValueError, match="reward_weights: has 2 entries for 1 reward_funcs"):
        SudokuTask(num_train=0, reward_funcs=["trl.rewards.think_format_reward"], reward_weights=[1.0, 2.0])
    with pytest.raises(ValueError, match="reward_completions"):
        SudokuTask(num_train=0, reward_completions="chat")
    with pytest.raises(ValueError, match="returned 1 values for 2 completions"):
        call_reward_func(lambda prompts, completions, **kw: [0.0], ["p", "q"], ["a", "b"])


def test_cli_trains_with_a_trl_reward_and_logs_its_metrics(tmp_path):
    from lit_rl.cli import run_lightning_cli

    cli = run_lightning_cli([
        "fit",
        "--config", str(ROOT / "conf/erils.yaml"),
        "--config", str(ROOT / "tests/tiny_overlay.yaml"),
        f"--trainer.default_root_dir={tmp_path}",
        f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
        f"--data.init_args.pool_path={ROOT}/data/pools/sudoku_scripted.jsonl.gz",
        "--data.init_args.task.init_args.reward_funcs=[trl.rewards.think_format_reward]",
        "--data.init_args.task.init_args.reward_weights=[0.5]",
    ])
    assert cli.trainer.global_step == 4
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    run = client.search_runs([client.get_experiment_by_name("lit_rl-embedded").experiment_id])[0]
    m = run.data.metrics
    # no completion writes <think>: TRL's function gives 0 to every row; the verifier's metric is there too
    assert m["rewards/think_format_reward/mean"] == 0.0
    assert 0.0 <= m["rewards/sudoku_reward/mean"] <= 1.0
    assert m["train/external/reward_mean"] > 0.5  # the weighted 0 left the verifier's rewards as they were
