"""User reward functions: ``None`` or a scalar instead of a list, strings (never taken as numbers) or ``inf`` is
one :class:`~lit_rl.errors.RewardError` naming the function and the row (and its prompt id), not a bare
``TypeError`` or a ``NonFiniteUpdateError`` later; a NaN or ``None`` row is the documented skip (no reward, adds
nothing); ``reward_timeout`` bounds a slow call with one warning per function.
"""

from __future__ import annotations

import contextlib
import io
import math
import time
import warnings
from pathlib import Path

import pytest

from lit_rl import cli
from lit_rl.errors import RewardError
from lit_rl.tasks import SudokuTask

ROOT = Path(__file__).resolve().parents[2]
POOL = ROOT / "data/pools/sudoku_scripted.jsonl.gz"


def returns_none(prompts, completions, **kwargs):
    return None


def returns_scalar(prompts, completions, **kwargs):
    return 0.5


def returns_strings(prompts, completions, **kwargs):
    return ["1.0"] * len(completions)


def inf_at_row_2(prompts, completions, **kwargs):
    return [math.inf if i == 2 else 0.0 for i in range(len(completions))]


def nan_everywhere_but_row_0(prompts, completions, **kwargs):
    return [1.0] + [math.nan] * (len(completions) - 1)


def raises_at_row_3(prompts, completions, prompt_id, **kwargs):
    out = []
    for pid in prompt_id:
        out.append(1 / 0 if pid == RAISE_ON else 0.0)  # the line the error names
    return out


RAISE_ON = SudokuTask(num_train=8).train_examples()[3].id


def raises_on_a_batch_only(prompts, completions, **kwargs):
    if len(completions) > 1:
        raise ValueError("expects one completion at a time")
    return [0.0]


def huge_at_row_1(prompts, completions, **kwargs):
    return [1e300 if i == 1 else 0.0 for i in range(len(completions))]


def sleepy(prompts, completions, **kwargs):
    time.sleep(3.0)
    return [1.0] * len(completions)


def _scores(func, **task_kw):
    task = SudokuTask(num_train=8, reward_funcs=[func], **task_kw)
    examples = task.train_examples()[:4]
    return task.total_rewards(["no answer"] * 4, examples), examples


@pytest.mark.parametrize("func, fragments", [
    (returns_none, ["reward function returns_none returned NoneType None", "a list of one float"]),
    (returns_scalar, ["reward function returns_scalar returned float 0.5", "a list of one float"]),
    (returns_strings, ["reward function returns_strings returned str '1.0' at row 0 (prompt 'sudoku-train-"]),
    (inf_at_row_2, ["reward function inf_at_row_2 returned inf at row 2 (prompt 'sudoku-train-", "must be finite"]),
    (huge_at_row_1, ["reward function huge_at_row_1 returned 1e+300 at row 1 (prompt 'sudoku-train-",
                      "a reward's size must be at most 1e+06 (the task's max_abs_reward"]),
    (raises_at_row_3, [f"reward function raises_at_row_3 raised ZeroDivisionError: division by zero at row 3 (prompt "
                       f"{RAISE_ON!r}) ({__file__}:", "LIT_RL_DEBUG=1 prints the traceback"]),
    (raises_on_a_batch_only, ["reward function raises_on_a_batch_only raised ValueError: expects one completion at a "
                              "time on a batch of 4 completions (each row alone passes)"]),
])
def test_a_bad_reward_output_names_the_function_and_the_row(func, fragments):
    with pytest.raises(RewardError) as err:
        _scores(func)
    for frag in fragments:
        assert frag in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_nan_and_none_are_the_documented_skip():
    scores, _ = _scores(nan_everywhere_but_row_0)
    own = scores.per_func["sudoku_reward"]
    assert scores.totals == [own[0] + 1.0] + own[1:]  # NaN adds nothing, as TRL's nansum


def test_a_slow_reward_function_times_out_with_one_warning_naming_it():
    from lit_rl.tasks import rewards

    rewards._TIMED_OUT.discard("sleepy")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        first, _ = _scores(sleepy, reward_timeout=0.2)
        second, _ = _scores(sleepy, reward_timeout=0.2)
        dt = time.perf_counter() - t0
    assert dt < 2.0, f"waited {dt:.1f}s"
    msgs = [str(w.message) for w in caught if "reward_timeout" in str(w.message)]
    assert len(msgs) == 1 and "reward function sleepy did not return within reward_timeout = 0.2 s" in msgs[0], msgs
    assert first.totals == first.per_func["sudoku_reward"] and all(v != v for v in second.per_func["sleepy"])


def _fit_with_reward(tmp_path, name: str) -> tuple[int, str]:
    """``fit`` of the tiny ERILS config (2 updates) with this module's reward ``name``: (exit status, stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = cli.main([
            "fit", "--config", str(ROOT / "conf/erils.yaml"), "--config", str(ROOT / "tests/tiny_overlay.yaml"),
            f"--trainer.default_root_dir={tmp_path}/run", f"--data.init_args.pool_path={POOL}",
            f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path}/mlflow.db", "--trainer.max_steps=2",
            f"--data.init_args.task.init_args.reward_funcs=[{__name__}.{name}]",
        ])
    return rc, err.getvalue()


def test_an_infinite_reward_stops_fit_with_one_line(tmp_path):
    """Through the CLI: one ``error:`` line naming the function and the row, exit 2 (was a NonFiniteUpdateError
    traceback about the loss)."""
    rc, text = _fit_with_reward(tmp_path, "inf_at_row_2")
    errors = [ln for ln in text.splitlines() if ln.startswith("error:")]
    assert rc == 2 and len(errors) == 1, text[-2000:]
    assert "reward function inf_at_row_2 returned inf at row 2 (prompt 'sudoku-train-" in errors[0], errors[0]


@pytest.mark.parametrize("debug", [False, True])
def test_a_reward_function_that_raises_stops_fit_with_one_line(tmp_path, monkeypatch, debug):
    """Through the CLI: one ``error:`` line naming the function, the row, the prompt id and the function's line,
    exit 2 (was a 94-line traceback); ``LIT_RL_DEBUG=1`` prints the traceback above it."""
    if debug:
        monkeypatch.setenv("LIT_RL_DEBUG", "1")
    rc, text = _fit_with_reward(tmp_path, "raises_on_a_batch_only")
    errors = [ln for ln in text.splitlines() if ln.startswith("error:")]
    assert rc == 2 and len(errors) == 1, text[-2000:]
    assert errors[0].startswith("error: reward function raises_on_a_batch_only raised ValueError: expects one "
                                "completion at a time on a batch of"), errors[0]
    assert ("Traceback (most recent call last)" in text) is debug


def test_non_finite_updates_name_the_last_batch_reward_range():
    from lit_rl.algorithms.rl_module import reward_summary

    import torch

    stats = {"train/on_policy/rewards/sudoku_reward/mean": 0.5, "train/on_policy/rewards/brevity/std": 0.1,
             "train/on_policy/rewards/brevity/mean": -2.0, "train/on_policy/reward_mean": 0.1}
    assert reward_summary(torch.tensor([0.0, float("nan"), -3.5, 1e5]), stats) == (
        "the last rollout batch's rewards ranged from -3.5 to 100000 (reward functions: brevity, sudoku_reward)")
    assert reward_summary(torch.tensor([float("nan")]), {}) == (
        "the last rollout batch's rewards were all NaN (no reward)")


def test_the_row_search_of_a_failed_batch_is_bounded():
    """A failing batch is searched row by row for its first failing row, on at most 16 rows: a network or paid
    reward is not called hundreds of times to word an error."""
    from lit_rl.tasks.rewards import call_reward_func

    calls = []

    def batch_only(prompts, completions, **kwargs):
        calls.append(len(completions))
        if len(completions) > 1:
            raise ValueError("expects one completion at a time")
        return [0.0]

    with pytest.raises(RewardError) as err:
        call_reward_func(batch_only, [None] * 40, ["x"] * 40)
    assert "on a batch of 40 completions (the first 16 rows alone pass)" in str(err.value), str(err.value)
    assert calls == [40] + [1] * 16
