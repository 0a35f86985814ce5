"""lit_rl/tasks/base.py: the shared Task API (TRL-style reward callables, reward kwargs) and EvalScore."""

import math

import pytest

from lit_rl.tasks import CountdownTask, MathTask


def test_task_reward_funcs_are_trl_callables():
    cd = CountdownTask(num_train=0)
    f = cd.reward_func()
    assert f.__name__ == "countdown_reward"
    exs = cd.eval_examples()[:2]
    kw = cd.reward_kwargs(exs)
    comps = [[{"role": "assistant", "content": "<answer>93 + 30 - 100</answer>"}], "<answer>1</answer>"]
    assert f([cd.messages(e) for e in exs], comps, **kw, trainer_state=None) == [1.0, 0.1]
    m = MathTask()
    g = m.reward_func()
    assert g(["p"], ["<answer>\\boxed{2}</answer>"], answer=["2"]) == [3.0]
    with pytest.raises(ValueError, match="answer"):
        g(["p"], ["x"])


def test_eval_score_fraction():
    from lit_rl.tasks import EvalScore

    assert EvalScore(3, 4).fraction == 0.75 and EvalScore(0, 0).fraction == 0.0
    assert math.isclose(EvalScore(1, 3).fraction, 1 / 3)
