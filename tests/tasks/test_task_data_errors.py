"""Malformed data files and generation records: a ValueError that names the file, line and field."""

import json
import re

import pytest

from lit_rl.tasks import CountdownTask, MathTask, SudokuTask
from lit_rl.tasks.countdown import read_cd3_test
from lit_rl.tasks.sudoku import read_sudoku_csv

GOOD_CD = '{"input": "30,100,93", "output": "23"}\n'


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ("not json", "cd.jsonl:3: not valid JSON"),
        ('{"input": "1,2,3"}', "cd.jsonl:3: field 'output' missing"),
        ('{"output": "6"}', "cd.jsonl:3: field 'input' missing"),
        ('{"input": "1,x,3", "output": "6"}', "cd.jsonl:3: field 'input' must be comma-separated integers"),
        ('{"input": [1, 2, 3], "output": "6"}', "cd.jsonl:3: field 'input' must be comma-separated integers"),
        ('{"input": "1,2,3", "output": "six"}', "cd.jsonl:3: field 'output' must be an integer"),
        ('{"input": "1,2,3", "output": Infinity}', "cd.jsonl:3: not valid JSON (Infinity is not JSON)"),
        ('{"input": "1,2,3", "output": ' + "9" * 5000 + "}", "cd.jsonl:3: not valid JSON (Exceeds the limit"),
        ("[" * 100_000 + "]" * 100_000, "cd.jsonl:3: not valid JSON (nested too deeply)"),
        ("[1, 2]", "cd.jsonl:3: expected a JSON object per line, got list"),
    ],
)
def test_countdown_test_file_errors(tmp_path, bad_line, message):
    p = tmp_path / "cd.jsonl"
    p.write_text(GOOD_CD + "\n" + bad_line + "\n")  # line 2 is blank: the line number is the file's
    with pytest.raises(ValueError, match=re.escape(message)):
        read_cd3_test(str(p))


def test_countdown_test_file_not_utf8(tmp_path):
    p = tmp_path / "cd.jsonl"
    p.write_bytes(GOOD_CD.encode() + b'{"input": "1,2,3", "output": "\xff"}\n')
    with pytest.raises(ValueError, match=r"cd.jsonl:2: not valid UTF-8"):
        read_cd3_test(str(p))


def test_countdown_test_file_accepts_int_output_and_crlf(tmp_path):
    p = tmp_path / "cd.jsonl"
    p.write_bytes(b'{"input": "30, 100,93", "output": 23}\r\n')
    assert read_cd3_test(str(p)) == (((30, 100, 93), 23),)


HEADER = "Puzzle,Solution\n"
GOOD_SUDOKU = "3102200002100320,3142243142131324\n"


@pytest.mark.parametrize(
    "content, message",
    [
        (HEADER + GOOD_SUDOKU + "3102200002100320\n", "s.csv:3: field 'Solution' missing (the row has 1 field(s))"),
        ("Puz,Sol\n" + GOOD_SUDOKU, "s.csv:1: the header must name the columns 'Puzzle' and 'Solution'"),
        ("", "s.csv:1: the header must name the columns"),
        (HEADER + "12,1234\n", "s.csv:2: field 'Puzzle' must be 16 digits 0-4 ('0' = blank), got '12'"),
        (HEADER + "3102200002100325,3142243142131324\n", "s.csv:2: field 'Puzzle' must be 16 digits 0-4"),
        (HEADER + "3102200002100320,1234\n", "s.csv:2: field 'Solution' must be 16 digits 1-4, got '1234'"),
        (HEADER + "0000000000000000,1111111111111111\n", "s.csv:2: field 'Solution' is not a valid 4x4 Sudoku"),
        # a valid grid, but not the one the givens describe (cell 0 is given as 3)
        (HEADER + "3102200002100320,1234341221434321\n",
         "s.csv:2: field 'Solution' (1234341221434321) contradicts the given of 'Puzzle'"),
        # a quoted field over lines 3-4 (line 2 blank): the line is where the row ends
        (HEADER + '\n"31022000\n02100320",3142243142131324\n', "s.csv:4: field 'Puzzle' must be 16 digits"),
    ],
)
def test_sudoku_csv_errors(tmp_path, content, message):
    p = tmp_path / "s.csv"
    p.write_text(content)
    with pytest.raises(ValueError, match=re.escape(message)):
        read_sudoku_csv(p)


def test_sudoku_csv_tolerates_bom_blank_lines_and_extra_columns(tmp_path):
    p = tmp_path / "s.csv"
    p.write_bytes(b"\xef\xbb\xbfid,Puzzle,Solution\r\n\r\n7, 3102200002100320 ,3142243142131324\r\n")
    assert read_sudoku_csv(p) == [("3102200002100320", "3142243142131324")]


def _math_file(tmp_path, *lines):
    p = tmp_path / "m.jsonl"
    p.write_text("".join(line + "\n" for line in lines))
    return str(p)


@pytest.mark.parametrize(
    "bad_line, message",
    [
        (json.dumps({"problem": "x", "answer": ["x"]}), "m.jsonl:3: answer field 'answer' must be a string, got list"),
        (json.dumps({"problem": "x", "answer": 1.5}), "m.jsonl:3: answer field 'answer' must be a string, got float"),
        (json.dumps({"problem": "x", "solution": "no box"}), "m.jsonl:3: no answer field 'answer'"),
        (json.dumps({"answer": "1"}), "m.jsonl:3: missing problem field 'problem'"),
        ('{"problem": "x", "answer": ' + "1" * 5000 + "}", "m.jsonl:3: not valid JSON (Exceeds the limit"),
        ('{"problem": "x", "answer": NaN}', "m.jsonl:3: not valid JSON (NaN is not JSON)"),
        ("[" * 100_000 + "]" * 100_000, "m.jsonl:3: not valid JSON (nested too deeply)"),
    ],
)
def test_math_rows_name_the_file_line_and_field(tmp_path, bad_line, message):
    # the report's line is the file line (the blank line 2 is counted), not the row number
    path = _math_file(tmp_path, json.dumps({"problem": "1+1?", "answer": "2"}), "", bad_line)
    with pytest.raises(ValueError, match=re.escape(message)):
        MathTask(train_path=path).train_examples()
    with pytest.raises(ValueError, match=re.escape(message)):
        MathTask(eval_path=path).eval_examples()


def test_math_rows_utf8_and_int_answers(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_bytes(json.dumps({"problem": "Wert von π?", "answer": 3}, ensure_ascii=False).encode() + b"\n")
    ex = MathTask(train_path=str(p)).train_examples()[0]
    assert ex.answer == "3" and "π" in ex.question
    p.write_bytes(b'{"problem": "1+1?", "answer": "2"}\n{"problem": "\xe9", "answer": "1"}\n')
    with pytest.raises(ValueError, match="m.jsonl:2: not valid UTF-8"):
        MathTask(train_path=str(p)).train_examples()


def test_math_corrupt_parquet_names_the_file(tmp_path):
    p = tmp_path / "t.parquet"
    p.write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match="t.parquet: not a readable Parquet file"):
        MathTask(train_path=str(p)).train_examples()


# -- generation records (lit-rl score) ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "ground_truth, message",
    [
        ([[1, 2, 3], float("inf")], "'ground_truth[1]' must be a finite number"),
        ([[1, 2, 3], float("nan")], "'ground_truth[1]' must be a finite number"),
        ([[1, 2, 3], 10**5000], "'ground_truth[1]' must be a finite number (|x| < 1e15), got <int too large to print>"),
        ([[1, 2, 3], True], "'ground_truth[1]' must be a finite number"),
        ([[1, 2.5, 3], 6], "'ground_truth[0]' must be a non-empty list of integers"),
        ([[], 6], "'ground_truth[0]' must be a non-empty list of integers"),
        (["1,2,3", 6], "'ground_truth[0]' must be a non-empty list of integers"),
        ({"numbers": [1, 2, 3], "target": None}, "'ground_truth['target']' must be a finite number"),
        ({"numbers": None, "target": 6}, "'ground_truth['numbers']' must be a non-empty list"),
        ("nope", "'ground_truth' must be [numbers, target]"),
    ],
)
def test_countdown_record_types(ground_truth, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        CountdownTask(num_train=0).example_from_record("q", ground_truth)


def test_countdown_record_accepts_the_reference_shapes():
    task = CountdownTask(num_train=0)
    for gt in ([[49, 55, 53], 51], {"numbers": ["49", "55", "53"], "target": 51.0}, None):
        ex = task.example_from_record("Numbers: [49, 55, 53]\nTarget: 51", gt)
        assert ex.answer == ([49, 55, 53], 51) and type(ex.answer[1]) is int
    assert task.example_from_record("q", [[1, 2], 0.5]).answer == ([1, 2], 0.5)
    with pytest.raises(ValueError, match=r"'question \(Target: ...\)' must be a finite number"):
        task.example_from_record("Numbers: [1, 2]\nTarget: " + "9" * 5000, None)


@pytest.mark.parametrize(
    "extra, ground_truth, message",
    [
        ({"puzzle": 1234341221434321}, "1234341221434321", "field 'puzzle' must be 16 digits 0-4"),
        ({"puzzle": "12"}, "1234341221434321", "field 'puzzle' must be 16 digits 0-4"),
        ({"puzzle": "1034341221434321"}, 1234341221434321, "field 'ground_truth' must be 16 digits 1-4"),
        ({"puzzle": "1034341221434321"}, "1234", "field 'ground_truth' must be 16 digits 1-4"),
        ({"puzzle": "4034341221434321"}, "1234341221434321",
         "field 'ground_truth' (1234341221434321) contradicts the given of 'puzzle'"),
        ({}, "1234341221434321", "no 16-digit puzzle in 'puzzle' or 'question'"),
        ({"puzzle": "1034341221434321", "prompt_id": ["a"]}, "1234341221434321",
         "'prompt_id' must be a string, got list"),
    ],
)
def test_sudoku_record_types(extra, ground_truth, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        SudokuTask(num_train=0).example_from_record("no puzzle", ground_truth, **extra)


def test_record_question_must_be_text():
    for task, gt in ((MathTask(), "2"), (CountdownTask(num_train=0), [[1, 2], 3]),
                     (SudokuTask(num_train=0), "1234341221434321")):
        with pytest.raises(ValueError, match="'question' must be a string, got dict"):
            task.example_from_record({"q": 1}, gt, puzzle="1034341221434321")
    with pytest.raises(ValueError, match=r"'ground_truth' must be the reference answer string, got \['x'\]"):
        MathTask().example_from_record("q", ["x"])
