"""Sudoku: grids, SPG split, generator, reward (§4) and eval parsing (§5) on hand-made cases."""

import pytest

from lit_rl.tasks import SudokuTask, get_task
from lit_rl.tasks.sudoku import (
    all_grids,
    count_solutions,
    is_valid_grid,
    read_sudoku_csv,
    solve,
    spg_train_grids,
    SPG_TEST_CSV,
)

# puzzle 3 0 1 4 / 0 0 2 0 / 2 0 0 0 / 4 1 3 0: blanks at 1, 4, 5, 7, 9, 10, 11, 15 (8 blanks)
PUZZLE = "3014002020004130"
SOLUTION = "3214142323414132"


@pytest.fixture(scope="module")
def task():
    return SudokuTask(num_train=300)


@pytest.fixture(scope="module")
def ex(task):
    return task._example("t", PUZZLE, SOLUTION)


def test_288_valid_grids():
    grids = all_grids()
    assert len(grids) == 288 and len(set(grids)) == 288
    assert all(is_valid_grid(g) for g in grids)
    assert not is_valid_grid("1234123412341234")  # rows fine, columns not


def test_spg_split_is_solution_disjoint():
    test_solutions = {s for _, s in read_sudoku_csv(SPG_TEST_CSV)}
    assert len(read_sudoku_csv(SPG_TEST_CSV)) == 256
    assert len(test_solutions) == 88
    train = spg_train_grids()
    assert len(train) == 200
    assert not set(train) & test_solutions
    assert set(train) | test_solutions == set(all_grids())


def test_training_puzzles(task):
    exs = task.train_examples()
    train_grids = set(spg_train_grids())
    assert [e.id for e in exs[:3]] == ["sudoku-train-0", "sudoku-train-1", "sudoku-train-2"]
    for e in exs:
        puzzle, sol = e.meta["puzzle"], e.answer
        assert 6 <= puzzle.count("0") <= 12
        assert sol in train_grids
        assert count_solutions(puzzle) == 1 and solve(puzzle) == sol
        assert all(p in ("0", s) for p, s in zip(puzzle, sol))
        assert e.question.endswith(f"Solve the following Sudoku puzzle: {puzzle}\n")
    blank_counts = {e.meta["puzzle"].count("0") for e in exs}
    assert blank_counts == set(range(6, 13))  # 300 puzzles cover the whole range


def test_training_puzzles_deterministic_and_prefix_stable(task):
    other = SudokuTask(num_train=50)
    assert [e.meta["puzzle"] for e in other.train_examples()] == [e.meta["puzzle"] for e in task.train_examples()[:50]]
    seeded = [e.meta["puzzle"] for e in SudokuTask(num_train=5, seed=1).train_examples()]
    assert seeded != [e.meta["puzzle"] for e in task.train_examples()[:5]]


def test_blank_range_configurable():
    t = SudokuTask(num_train=40, min_blanks=10, max_blanks=10)
    assert {e.meta["puzzle"].count("0") for e in t.train_examples()} == {10}
    with pytest.raises(ValueError, match="max_blanks"):
        SudokuTask(min_blanks=5, max_blanks=13)


def test_eval_sets():
    spg = SudokuTask().eval_examples()
    d1 = SudokuTask(eval_set="d1").eval_examples()
    assert len(spg) == 256 and len(d1) == 500
    assert all(e.meta["puzzle"].count("0") == 8 for e in d1)
    assert spg[0].id == "sudoku-spgtest-0" and spg[0].meta["puzzle"] == "0310200404001043"
    with pytest.raises(ValueError, match="eval_set"):
        SudokuTask(eval_set="x")


def test_solver_helpers():
    assert solve(PUZZLE) == SOLUTION
    assert count_solutions("0" * 16) == 2
    assert count_solutions("0" * 16, limit=1000) == 288
    assert count_solutions("1100" + "0" * 12) == 0 and solve("1100" + "0" * 12) is None
    with pytest.raises(ValueError):
        solve("12345")


@pytest.mark.parametrize(
    "completion, expected",
    [
        (f"<reasoning>r</reasoning>\n<answer>\n{SOLUTION}\n</answer>", 1.0),
        ("<answer>\n3214 1423\n2341 4132\n</answer>", 1.0),  # only digits are kept
        ("<answer>3,2,1,4,1,4,2,3,2,3,4,1,4,1,3,2</answer>", 1.0),
        ("<answer>3214142300000000</answer>", 0.5),  # blanks 1,4,5,7 right; 9,10,11,15 wrong
        ("<answer>32</answer>", 0.125),  # padded with '0': only blank 1 right
        (f"<answer>{SOLUTION}999</answer>", 1.0),  # cut to 16
        (f"<answer>{PUZZLE}</answer>", 0.0),
        (f"<answer>{SOLUTION}</answer> then <answer>0000</answer>", 0.0),  # last block counts
        (f"<answer>0000</answer> then <answer>{SOLUTION}</answer>", 1.0),
        (f"<answer>{SOLUTION}", 0.0),  # never closed
        (SOLUTION, 0.0),  # no tags
        ("<answer>abc</answer>", 0.0),
        ("", 0.0),
    ],
)
def test_reward(task, ex, completion, expected):
    assert task.reward(completion, ex) == pytest.approx(expected)


@pytest.mark.parametrize(
    "completion, correct",
    [
        (f"<answer>{SOLUTION}</answer>", 8),
        ("<answer>\n```\n3214 1423\n2341 4132\n```\n</answer>", 8),  # fenced block
        (f"<answer>\n{SOLUTION}<|eot_id|>", 8),  # end token instead of </answer>
        (f"</answer>\n{SOLUTION}", 8),  # text after </answer>
        (f"grid {SOLUTION} done", 8),  # standalone 16-digit word
        ("<answer>3,2,1,4,1,4,2,3,2,3,4,1,4,1,3,2</answer>", 2),  # commas kept: only cells 4 and 10 line up
        ("<answer>32</answer>", 1),
        ("<answer> </answer>", 0),
        ("nothing here", 0),
        ("", 0),
    ],
)
def test_eval_parsing(task, ex, completion, correct):
    assert task.evaluate(completion, ex) == (correct, 8)


def test_eval_vs_reward_parser(task, ex):
    text = f"<answer>\n{SOLUTION}<|eot_id|>"
    assert task.evaluate(text, ex, parser="eval").fraction == 1.0
    assert task.evaluate(text, ex, parser="reward").fraction == 0.0
    with pytest.raises(ValueError, match="parser"):
        task.evaluate(text, ex, parser="nope")


def test_prompts():
    t = SudokuTask(num_train=1)
    e = t.eval_examples()[0]
    (msg,) = t.messages(e)
    assert msg["role"] == "user" and msg["content"].startswith("\nPlease solve the following 4x4 Sudoku puzzle.")
    assert msg["content"].endswith("</answer>\n\n\nSolve the following Sudoku puzzle: 0310200404001043\n")
    compact = get_task("sudoku", num_train=1, system_prompt="", question_template="{puzzle}")
    assert compact.messages(compact.eval_examples()[0]) == [{"role": "user", "content": "0310200404001043"}]
    sys_role = SudokuTask(num_train=1, system_role=True)
    assert [m["role"] for m in sys_role.messages(e)] == ["system", "user"]


def test_trl_reward_callable(task):
    f = task.reward_func()
    comps = [f"<answer>{SOLUTION}</answer>", [{"role": "assistant", "content": "<answer>32</answer>"}]]
    out = f(["p", "p"], comps, answer=[SOLUTION, SOLUTION], puzzle=[PUZZLE, PUZZLE], solution=[SOLUTION, SOLUTION])
    assert out == [1.0, 0.125]
