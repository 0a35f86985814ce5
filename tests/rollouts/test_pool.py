import json

import pytest

from lit_rl.rollouts.pool import PoolFormatError, PoolRecord, _header, load_pool, reorder_usable_first, write_pool_atomic


def _rec(pid, i, tokens, reward=1.0):
    return PoolRecord(prompt_id=pid, index=i, source="s", completion=f"c{i}", reward=reward, num_tokens=tokens, tokenizer="t")


def test_reorder_usable_first_keeps_order_and_ignores_reward():
    recs = [_rec("a", 0, 600, 1.0), _rec("a", 1, 100, 0.0), _rec("a", 2, 501), _rec("a", 3, 500, 0.5)]
    out = reorder_usable_first(recs)
    # usable (<=500): c1, c3 in their original order; then the unusable c0, c2
    assert [r.completion for r in out] == ["c1", "c3", "c0", "c2"]
    assert [r.index for r in out] == [0, 1, 2, 3]
    assert [r.usable for r in out] == [True, True, False, False]


def test_load_pool_takes_first_g_ext_usable_and_drops_short_prompts(tmp_path):
    path = tmp_path / "pool.jsonl"
    recs = reorder_usable_first([_rec("a", 0, 10), _rec("a", 1, 900), _rec("a", 2, 20)]) + reorder_usable_first([_rec("b", 0, 10), _rec("b", 1, 900)])
    write_pool_atomic(path, _header("sudoku", "s", "t"), recs)
    pool = load_pool(path, g_ext=2, valid_ids=["a", "b"], task="sudoku")
    # "a" has 2 usable (c0, c2); "b" only 1 usable < G_ext=2 -> left out
    assert list(pool) == ["a"]
    assert [r.completion for r in pool["a"]] == ["c0", "c2"]


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "pool.jsonl:3: invalid JSON"),
        (json.dumps({"prompt_id": "a", "index": 0}), "pool.jsonl:3: missing field 'source'"),
        (json.dumps({"prompt_id": "zzz", "index": 0, "source": "s", "completion": "c", "reward": 1.0, "num_tokens": 3, "tokenizer": "t"}), "pool.jsonl:3: prompt_id 'zzz' is not in the task's training set"),
        (json.dumps({"prompt_id": "a", "index": 0, "source": "s", "completion": "c", "reward": "high", "num_tokens": 3, "tokenizer": "t"}), "pool.jsonl:3: field 'reward' has type str"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "pool.jsonl"
    write_pool_atomic(path, _header("sudoku", "s", "t"), [_rec("a", 0, 10)])
    with path.open("a") as fh:
        fh.write(line + "\n")
    with pytest.raises(PoolFormatError, match=message.replace("(", r"\(")):
        load_pool(path, g_ext=1, valid_ids=["a"])


def test_truncated_last_line_and_wrong_task(tmp_path):
    path = tmp_path / "pool.jsonl"
    write_pool_atomic(path, _header("sudoku", "s", "t"), [_rec("a", 0, 10)])
    with pytest.raises(PoolFormatError, match="for task 'sudoku', the run's task is 'countdown'"):
        load_pool(path, 1, task="countdown")
    with path.open("a") as fh:
        fh.write('{"prompt_id": "a"')
    with pytest.raises(PoolFormatError, match=r"pool.jsonl:3: truncated last line"):
        load_pool(path, 1)


def test_atomic_write_leaves_no_partial_file(tmp_path):
    path = tmp_path / "pool.jsonl"

    def boom():
        yield _rec("a", 0, 1)
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        write_pool_atomic(path, _header("sudoku", "s", "t"), boom())
    assert not path.exists() and list(tmp_path.iterdir()) == []
