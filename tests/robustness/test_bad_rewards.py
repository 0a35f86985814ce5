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


def test_an_infinite_reward_stops_fit_with_one_line(tmp_path):
    """Through the CLI: one ``error:`` line naming the function and the row, exit 2 (was a NonFiniteUpdateError
    traceback about the loss)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = cli.main([
            "fit", "--config", str(ROOT / "conf/erils.yaml"), "--config", str(ROOT / "tests/tiny_overlay.yaml"),
            f"--trainer.default_root_dir={tmp_path}/run", f"--data.init_args.pool_path={POOL}",
            f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path}/mlflow.db", "--trainer.max_steps=2",
            f"--data.init_args.task.init_args.reward_funcs=[{__name__}.inf_at_row_2]",
        ])
    errors = [ln for ln in err.getvalue().splitlines() if ln.startswith("error:")]
    assert rc == 2 and len(errors) == 1, err.getvalue()[-2000:]
    assert "reward function inf_at_row_2 returned inf at row 2 (prompt 'sudoku-train-" in errors[0], errors[0]
