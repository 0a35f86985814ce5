"""``lit-rl score``: reference numbers on the shared LLaDA-8B-Instruct generations, formats, errors."""

import json
from pathlib import Path

import pytest

from lit_rl.score import InputError, main, score_files

REPO_ROOT = Path(__file__).resolve().parents[1]
BASELINES = Path(REPO_ROOT).parent / "shared" / "data" / "d1" / "eval" / "eval_baselines"


def baseline_files(task):
    files = sorted(BASELINES.glob(f"{task}_instruct_256_128_*_generations.json"))
    if not files:
        pytest.skip(f"LLaDA baseline generations not found under {BASELINES} (the shared data folder is absent)")
    return files


@pytest.mark.parametrize(
    "task, accuracy, n, total",
    [("sudoku", 6.69, 256, 2048), ("countdown", 19.53, 256, 256), ("math500", 32.40, 500, 500)],
)
def test_reference_numbers(task, accuracy, n, total):
    # ALGORITHMS.md §5: the reference evaluation gives these on the shared generations (all ranks pooled)
    out = score_files(task, baseline_files(task), parser="eval")
    assert round(out["accuracy_pct"], 2) == accuracy  # d1 prints percent
    assert out["accuracy"] == pytest.approx(out["accuracy_pct"] / 100, abs=1e-6)
    assert out["n"] == n and out["total"] == total


@pytest.mark.parametrize("task", ["sudoku", "countdown", "math500"])
def test_reward_parser_runs(task, capsys):
    files = baseline_files(task)
    assert main(["--task", task, "--parser", "reward", "--generations", *map(str, files)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["parser"] == "reward" and 0.0 <= out["accuracy"] <= 1.0
    assert 0.0 <= out["mean_reward"] <= out["max_reward"]


def test_cli_prints_one_json_object(capsys):
    files = baseline_files("countdown")
    assert main(["--task", "countdown", "--generations", *map(str, files)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert {"accuracy", "mean_reward", "n", "parser"} <= set(out) and out["parser"] == "eval"


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_format(tmp_path):
    p = write_jsonl(
        tmp_path / "cd.jsonl",
        [
            {"prompt_id": "a", "question": "Numbers: [49, 55, 53]\nTarget: 51",
             "completion": "<answer>49 + 55 - 53</answer>", "ground_truth": [[49, 55, 53], 51]},
            {"question": "q", "completion": "<answer>49 + 55</answer>",
             "ground_truth": {"numbers": [49, 55, 53], "target": 51}},
        ],
    )
    out = score_files("countdown", [p])
    assert out["n"] == 2 and out["accuracy"] == 0.5 and out["mean_reward"] == pytest.approx(0.55)
    s = write_jsonl(
        tmp_path / "s.jsonl",
        [{"question": "Solve the following Sudoku puzzle: 3014002020004130\n",
          "completion": "<answer>3214142300000000</answer>", "ground_truth": "3214142323414132"}],
    )
    out = score_files("sudoku", [s])
    assert out["total"] == 8 and out["correct"] == 4 and out["accuracy"] == 0.5 and out["mean_reward"] == 0.5


def test_pooling_over_files(tmp_path):
    rows = [{"question": "q", "completion": "\\boxed{2}", "ground_truth": "2"},
            {"question": "q", "completion": "3", "ground_truth": "2"}]
    a = write_jsonl(tmp_path / "a.jsonl", rows[:1])
    b = write_jsonl(tmp_path / "b.jsonl", rows[1:] * 3)
    out = score_files("math500", [a, b])
    assert out["n"] == 4 and out["accuracy"] == 0.25


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"question": "q", "completion": "x", "ground_truth": "2"}\n{broken\n', "bad.jsonl:2: not valid JSON"),
        ('{"question": "q", "ground_truth": "2"}\n', "bad.jsonl:1: 'completion' must be a string"),
        ('{"completion": "x", "ground_truth": "2"}\n', "bad.jsonl:1: needs 'question' and 'ground_truth'"),
        ('[1, 2]\n', "bad.jsonl:1: expected a JSON object"),
        ('{"generations": 5}', "bad.jsonl: d1 JSON needs a top-level 'generations' list"),
        ('{"generations": [{"question": "q", "generations": "x", "ground_truth": 7}]}',
         "bad.jsonl: generations[0]: 'ground_truth'"),
    ],
)
def test_malformed_input(tmp_path, capsys, content, message):
    p = tmp_path / "bad.jsonl"
    p.write_text(content)
    assert main(["--task", "math500", "--generations", str(p)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in captured.err and "Traceback" not in captured.err
    assert captured.err.count("\n") == 1


def test_malformed_task_specific(tmp_path, capsys):
    p = write_jsonl(tmp_path / "s.jsonl",
                    [{"question": "no puzzle here", "completion": "x", "ground_truth": "3214142323414132"}])
    assert main(["--task", "sudoku", "--generations", str(p)]) == 2
    assert "s.jsonl:1: no 16-digit puzzle" in capsys.readouterr().err
    p = write_jsonl(tmp_path / "c.jsonl", [{"question": "q", "completion": "x", "ground_truth": "nope"}])
    assert main(["--task", "countdown", "--generations", str(p)]) == 2
    assert "c.jsonl:1: 'ground_truth' must be [numbers, target]" in capsys.readouterr().err


@pytest.mark.parametrize(
    "task, line, message",
    [
        ("countdown", '{"question": "q", "completion": "x", "ground_truth": [[1, 2, 3], Infinity]}',
         "g.jsonl:2: 'ground_truth[1]' must be a finite number"),
        ("countdown", '{"question": "q", "completion": "x", "ground_truth": [[1, 2, 3], 1e400]}',
         "g.jsonl:2: 'ground_truth[1]' must be a finite number"),
        ("countdown", '{"question": "q", "completion": "x", "ground_truth": [[1, 2, 3], ' + "9" * 5000 + "]}",
         "g.jsonl:2: not valid JSON (Exceeds the limit"),
        ("countdown", '{"question": "q", "completion": "x", "ground_truth": [[1, 2, 3], ' + "9" * 4000 + "]}",
         "g.jsonl:2: 'ground_truth[1]' must be a finite number"),
        ("sudoku", '{"question": "q", "completion": "x", "puzzle": 1234341221434321, '
                   '"ground_truth": "1234341221434321"}', "g.jsonl:2: field 'puzzle' must be 16 digits 0-4"),
        ("sudoku", '{"question": "q", "completion": "x", "puzzle": "1034341221434321", "ground_truth": "12"}',
         "g.jsonl:2: field 'ground_truth' must be 16 digits 1-4"),
        ("math500", '{"question": ["q"], "completion": "x", "ground_truth": "2"}',
         "g.jsonl:2: 'question' must be a string, got list"),
        ("math500", "[" * 100_000 + "]" * 100_000, "g.jsonl:2: not valid JSON (nested too deeply)"),
    ],
)
def test_malformed_record_types(tmp_path, capsys, task, line, message):
    p = tmp_path / "g.jsonl"
    good = {"question": "Numbers: [1, 2, 3]\nTarget: 6", "completion": "x", "ground_truth": "2"}
    good["ground_truth"] = {"countdown": [[1, 2, 3], 6], "sudoku": "1234341221434321", "math500": "2"}[task]
    good["puzzle"] = "1034341221434321"
    p.write_text(json.dumps(good) + "\n" + line + "\n")
    assert main(["--task", task, "--generations", str(p)]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and "Traceback" not in captured.err
    assert captured.err.count("\n") == 1


def test_d1_json_with_a_huge_number_is_an_input_error(tmp_path, capsys):
    p = tmp_path / "d1.json"
    p.write_text('{"generations": [{"question": "q", "generations": "x", "ground_truth": ' + "9" * 5000 + "}]}")
    assert main(["--task", "math500", "--generations", str(p)]) == 2
    err = capsys.readouterr().err
    assert "d1.json:1: not valid JSON" in err and "Traceback" not in err


def test_missing_file_and_bad_args(tmp_path, capsys):
    assert main(["--task", "sudoku", "--generations", str(tmp_path / "missing.json")]) == 2
    assert "missing.json: cannot read" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["--task", "chess", "--generations", "x"])
    assert e.value.code == 2
    with pytest.raises(InputError):
        score_files("sudoku", [])


def test_details_file_lists_every_item(tmp_path, capsys):
    p = write_jsonl(
        tmp_path / "cd.jsonl",
        [
            {"prompt_id": "a", "question": "Numbers: [49, 55, 53]\nTarget: 51",
             "completion": "<answer>49 + 55 - 53</answer>", "ground_truth": [[49, 55, 53], 51]},
            {"prompt_id": "b", "question": "q", "completion": "<answer>49 + 55</answer>",
             "ground_truth": [[49, 55, 53], 51]},
        ],
    )
    out_file = tmp_path / "details.jsonl"
    assert main(["--task", "countdown", "--generations", str(p), "--details", str(out_file)]) == 0
    assert json.loads(capsys.readouterr().out)["details"] == str(out_file)
    rows = [json.loads(line) for line in out_file.read_text().splitlines()]
    # item a is right (reward 1.0); item b uses two of the three numbers (0 correct, the reference's 0.1)
    assert [(r["id"], r["correct"], r["total"], r["reward"]) for r in rows] == [("a", 1, 1, 1.0), ("b", 0, 1, 0.1)]
    assert rows[1]["where"].endswith("cd.jsonl:2")


def test_prompts_task_scores_exact_answers(tmp_path, capsys):
    p = write_jsonl(tmp_path / "p.jsonl", [
        {"question": "2+2", "completion": "<answer>4</answer>", "ground_truth": "4"},
        {"question": "2+3", "completion": "<answer>6</answer>", "ground_truth": "5"},
    ])
    assert main(["--task", "prompts", "--generations", str(p)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["task"] == "prompts" and out["accuracy"] == 0.5


FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.mark.parametrize("task, name", [("countdown", "d1_countdown_128_item.json"),
                                        ("math500", "d1_math500_128_item.json")])
def test_reference_parser_is_d1s_on_its_divergent_items(task, name, tmp_path, capsys):
    # the one item of d1's Countdown-128 and of its MATH500-128 table where the written rules and d1's code
    # disagree: a correct <answer> block and no \boxed{}. d1 reads the whole text, so the item is wrong there.
    path = FIXTURES / name
    rec = json.loads(path.read_text())["generations"][0]
    assert "\\boxed" not in rec["generations"] and "<answer>" in rec["generations"]
    assert score_files(task, [path], parser="eval")["correct"] == 1
    details = tmp_path / "d.jsonl"
    assert main(["--task", task, "--generations", str(path), "--parser", "reference", "--details", str(details)]) == 0
    assert json.loads(capsys.readouterr().out)["correct"] == 0
    (row,) = [json.loads(line) for line in details.read_text().splitlines()]
    # d1 reads the whole generation (Countdown: it has no `expr = value` to cut), so its numbers never
    # match the three given ones and MATH's is_equiv never holds
    assert row["extracted"] == rec["generations"] and row["correct"] == 0


def test_reference_parser_boxes_as_d1_does():
    from lit_rl.tasks.countdown import eval_expression
    from lit_rl.tasks.math_task import math_eval_answer

    text = "<answer>\\frac{1}{4}</answer>"
    assert math_eval_answer(text) == "\\frac{1}{4}"  # the written rule: no box -> the answer block
    assert math_eval_answer(text, reference=True) == text  # d1: no box -> the whole text
    # an unbalanced box: d1's remove_boxed(None) raises and both fall back to the answer block
    assert math_eval_answer("\\boxed{1 <answer>2</answer>", reference=True) == "2"
    assert eval_expression("\\boxed{1+2 <answer>3+4</answer>", reference=True) == "3+4"
    # a box: both read it
    assert (eval_expression("<answer>1+2</answer> \\boxed{5-1}", reference=True) == "5-1"
            == eval_expression("\\boxed{5-1}"))
    # no box: d1 reads the whole text, keeping its first `expr = value` left side
    assert eval_expression("so 9 - 4 = 5 <answer>9-4</answer>", reference=True) == "9 - 4"
    assert eval_expression("so 9 - 4 = 5 <answer>9-4</answer>") == "9-4"


@pytest.mark.parametrize("task", ["sudoku", "countdown", "math500"])
def test_reference_parser_on_the_shared_generations(task):
    # at L_gen 256 the written rules and d1's code agree on every item (d1's code gives the same numbers)
    files = baseline_files(task)
    eval_items, ref_items = [], []
    assert (score_files(task, files, "eval", eval_items)["accuracy"]
            == score_files(task, files, "reference", ref_items)["accuracy"])
    assert [r["correct"] for r in eval_items] == [r["correct"] for r in ref_items]
    assert sum(r["extracted"] is not None for r in ref_items) > 0.9 * len(ref_items)
