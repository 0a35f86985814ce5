"""Your own reward function, as conf/real/own_data.yaml uses it: TRL's signature, plain Python, no lit_rl import.

lit_rl calls each reward function once per rollout batch, as TRL's ``GRPOTrainer`` does: by keyword, one value per
completion. ``completions`` are chat messages (``[{"role": "assistant", "content": text}]``, TRL's conversational
form); every column of the data file reaches the function under its own name (here ``solution``, ``kind``, ``id``),
plus ``prompts``, ``completion_ids`` and ``prompt_id``. Return a float per completion, or ``None`` for "no reward".
A config names the function by its import path (``examples.own_rewards.final_number``; run from the repository
root, or put your module anywhere on ``PYTHONPATH``). docs/rewards.md has the rules.
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"-?\d+")
_STATED = re.compile(r"(?:answer is|answer:|####)\s*\$?\s*(-?\d+)", re.IGNORECASE)


def final_number(completions, solution, **kwargs):
    """1.0 when the completion's answer is the solution, else 0.0. Its answer: the last one it states ("the answer
    is 7", "answer: 7", "#### 7"; a small instruct model often states it and then keeps writing), else the last
    number it writes."""
    rewards = []
    for completion, want in zip(completions, solution):
        text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
        stated = _STATED.findall(text)
        numbers = stated or _NUMBER.findall(text)
        rewards.append(1.0 if numbers and int(numbers[-1]) == int(want) else 0.0)
    return rewards
