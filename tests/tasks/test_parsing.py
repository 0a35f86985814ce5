"""The linear-time extractors agree with the reference regular expressions they replace.

The oracles below are the regex patterns quoted in ALGORITHMS.md §4-§5 (run only on short random texts,
where their worst-case cost does not matter).
"""

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from lit_rl.tasks.countdown import equals_lhs
from lit_rl.tasks.parsing import answer_blocks, first_answer_block, last_answer_block, sudoku_eval_answer

TOKENS = [
    "<answer>", "</answer>", "```", "<|eot_id|>", "<|endoftext|>", "1234123412341234", "12341234123412341",
    "1", "2", " ", "\n", "x", "=", "+", "(", ")", ".", "\\boxed{", "{", "}",
]
texts = st.lists(st.sampled_from(TOKENS), max_size=14).map("".join)


def oracle_sudoku(text):
    patterns = [
        r"<answer>.*?```\s*([\d\s]+)```",
        r"<answer>(.*?)(?:<\|eot_id\|>|<\|endoftext\|>|</answer>)",
        r"</answer>\s*(.*?)(?:<\|eot_id\|>|<\|endoftext\|>|$)",
        r".*?(\d{16})\s*</answer>",
        r"\b(\d{16})\b",
    ]
    out = ""
    for p in patterns:
        if out:
            break
        m = re.search(p, text, re.DOTALL)
        if m and m.group(1).strip():
            out = m.group(1).strip()
    return re.sub(r"\s", "", out)


@settings(max_examples=200, deadline=None)
@given(texts)
def test_answer_blocks_match_findall(text):
    expected = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)
    assert answer_blocks(text) == expected
    assert last_answer_block(text) == (expected[-1] if expected else None)
    m = re.search(r"<answer>(.*?)</answer>", text, re.DOTALL)
    assert first_answer_block(text) == (m.group(1) if m else None)


@settings(max_examples=300, deadline=None)
@given(texts)
def test_sudoku_eval_answer_matches_reference_patterns(text):
    assert sudoku_eval_answer(text) == oracle_sudoku(text)


@settings(max_examples=200, deadline=None)
@given(texts)
def test_equals_fragment_matches_reference_regex(text):
    m = re.search(r"([0-9+\-*/() ]+)=[0-9. ]+", text)
    got = equals_lhs(text)
    assert got == (m.group(1) if m else None)
