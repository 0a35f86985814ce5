"""Tests lit_rl/pools/length_control.py."""

import pytest

from lit_rl.pools.length_control import LengthControl
from lit_rl.tasks import get_task


def test_rewrite_prompt_holds_task_completion_and_instruction():
    task = get_task("sudoku", num_train=1)
    ex = task.train_examples()[0]
    lc = LengthControl(mode="two_stage", target_total_tokens=256)
    msgs = lc.rewrite_messages(task, ex, "  <reasoning>long</reasoning>\n<answer>1234</answer>  ")
    assert len(msgs) == 1 and msgs[0]["role"] == "user"
    body = msgs[0]["content"]
    assert ex.meta["puzzle"] in body and "<reasoning>long</reasoning>\n<answer>1234</answer>\n" in body
    assert body.endswith(lc.length_instruction()) and "about 256 tokens" in body
    assert lc.first_stage_messages(task, ex) == task.messages(ex)  # the first stage sees P_task only
    with pytest.raises(ValueError, match="must contain {completion}"):
        LengthControl(mode="two_stage", rewrite_prompt="{task_prompt} only")
    with pytest.raises(ValueError, match="mode='short'"):
        LengthControl(mode="short")
