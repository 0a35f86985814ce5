import gzip
import json

import pytest

from lit_rl.pools.pool import (PoolFormatError, PoolRecord, _header, load_pool, reorder_usable_first,
                                  repair_pool_for_resume, write_pool_atomic)


def _rec(pid, i, tokens, reward=1.0):
    return PoolRecord(prompt_id=pid, index=i, source="s", completion=f"c{i}", reward=reward, num_tokens=tokens,
                      tokenizer="t")


def test_reorder_usable_first_keeps_order_and_ignores_reward():
    recs = [_rec("a", 0, 600, 1.0), _rec("a", 1, 100, 0.0), _rec("a", 2, 501), _rec("a", 3, 500, 0.5)]
    out = reorder_usable_first(recs)
    # usable (<=500): c1, c3 in their original order; then the unusable c0, c2
    assert [r.completion for r in out] == ["c1", "c3", "c0", "c2"]
    assert [r.index for r in out] == [0, 1, 2, 3]
    assert [r.usable for r in out] == [True, True, False, False]


def test_load_pool_takes_first_g_ext_usable_and_drops_short_prompts(tmp_path):
    path = tmp_path / "pool.jsonl"
    recs = (reorder_usable_first([_rec("a", 0, 10), _rec("a", 1, 900), _rec("a", 2, 20)])
            + reorder_usable_first([_rec("b", 0, 10), _rec("b", 1, 900)]))
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
        (json.dumps({"prompt_id": "zzz", "index": 0, "source": "s", "completion": "c", "reward": 1.0, "num_tokens": 3,
                     "tokenizer": "t"}), "pool.jsonl:3: prompt_id 'zzz' is not in the task's training set"),
        (json.dumps({"prompt_id": "a", "index": 0, "source": "s", "completion": "c", "reward": "high", "num_tokens": 3,
                     "tokenizer": "t"}), "pool.jsonl:3: field 'reward' has type str"),
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


# -- bad input: every malformed pool is a PoolFormatError naming file:line and field ---------------------
GOOD = {"prompt_id": "a", "index": 0, "source": "s", "completion": "c", "reward": 1.0, "num_tokens": 3,
        "tokenizer": "t"}


@pytest.mark.parametrize(
    "line, message",
    [
        (json.dumps({**GOOD, "meta": "abc"}), "pool.jsonl:2: field 'meta' must be an object, got str"),
        (json.dumps({**GOOD, "meta": [1, 2]}), "pool.jsonl:2: field 'meta' must be an object, got list"),
        (json.dumps(GOOD).replace('"reward": 1.0', '"reward": 1' + "0" * 400),
         "pool.jsonl:2: field 'reward' is not finite"),
        (json.dumps(GOOD).replace('"num_tokens": 3', '"num_tokens": 1' + "0" * 5000),
         "pool.jsonl:2: invalid JSON .*4300 digits"),
        (json.dumps({**GOOD, "usable": "false"}),
         "pool.jsonl:2: field 'usable' must be true or false, got str 'false'"),
        (json.dumps({**GOOD, "index": -1}),
         r"pool.jsonl:2: field 'index' must be an integer in \[0, 2\*\*63\), got -1"),
        (json.dumps({**GOOD, "num_tokens": -5}), "pool.jsonl:2: field 'num_tokens' must be an integer in"),
        (json.dumps({**GOOD, "num_tokens": 10**30}), "pool.jsonl:2: field 'num_tokens' must be an integer in"),
        ("[" * 100_000 + "]" * 100_000, "pool.jsonl:2: invalid JSON .nested too deeply"),
    ],
)
def test_bad_field_values_name_file_line_and_field(tmp_path, line, message):
    path = tmp_path / "pool.jsonl"
    path.write_text(json.dumps(_header("sudoku", "s", "t")) + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(PoolFormatError, match=message):
        load_pool(path, g_ext=1)


def test_duplicate_record_is_rejected(tmp_path):
    path = tmp_path / "pool.jsonl"
    write_pool_atomic(path, _header("sudoku", "s", "t"), [_rec("a", 0, 10), _rec("a", 1, 10), _rec("a", 0, 10)])
    with pytest.raises(PoolFormatError, match="pool.jsonl:4: duplicate record prompt_id 'a' index 0, first at line 2"):
        load_pool(path, g_ext=1)


@pytest.mark.parametrize("version", ["true", "1.0", '"1"', "2"])
def test_header_version_must_be_the_integer(tmp_path, version):
    path = tmp_path / "pool.jsonl"
    path.write_text('{"lit_rl_pool": %s, "task": "sudoku"}\n' % version + json.dumps(GOOD) + "\n", encoding="utf-8")
    with pytest.raises(PoolFormatError, match='pool.jsonl:1: not a lit_rl pool header .expected "lit_rl_pool": 1'):
        load_pool(path, g_ext=1)
    with pytest.raises(PoolFormatError, match="pool.jsonl:1: not a lit_rl pool header"):
        repair_pool_for_resume(path, 1)


def test_header_nesting_bomb_and_huge_int(tmp_path):
    path = tmp_path / "pool.jsonl"
    path.write_text("[" * 100_000 + "\n", encoding="utf-8")
    with pytest.raises(PoolFormatError, match="pool.jsonl:1: header: invalid JSON .nested too deeply"):
        load_pool(path, g_ext=1)
    with pytest.raises(PoolFormatError, match="pool.jsonl:1: header: invalid JSON .nested too deeply"):
        repair_pool_for_resume(path, 1)
    path.write_text('{"lit_rl_pool": 1' + "0" * 5000 + "}\n", encoding="utf-8")
    with pytest.raises(PoolFormatError, match="pool.jsonl:1: header: invalid JSON .*4300 digits"):
        load_pool(path, g_ext=1)


def test_invalid_utf8_names_the_line(tmp_path):
    path = tmp_path / "pool.jsonl"
    write_pool_atomic(path, _header("sudoku", "s", "t"), [_rec("a", 0, 10)])
    with path.open("ab") as fh:
        fh.write(json.dumps({**GOOD, "index": 1, "completion": "xx"}).encode().replace(b"xx", b"\xff\xfe") + b"\n")
    with pytest.raises(PoolFormatError, match=r"pool.jsonl:3: not UTF-8"):
        load_pool(path, g_ext=1)
    with pytest.raises(PoolFormatError, match=r"pool.jsonl:3: not UTF-8"):  # not the last line: not a torn write
        with path.open("ab") as fh:
            fh.write(json.dumps({**GOOD, "index": 2}).encode() + b"\n")
        repair_pool_for_resume(path, 1)


def _gz_pool(tmp_path, k=2000):
    plain = tmp_path / "plain.jsonl"
    write_pool_atomic(plain, _header("sudoku", "s", "t"), [_rec(f"p{i}", 0, 10) for i in range(k)])
    return gzip.compress(plain.read_bytes(), mtime=0)


def test_damaged_gzip_is_a_pool_format_error(tmp_path):
    data = _gz_pool(tmp_path)
    path = tmp_path / "pool.jsonl.gz"
    path.write_bytes(data)
    assert len(load_pool(path, g_ext=1)) == 2000
    path.write_bytes(data[: len(data) // 2])  # truncated
    with pytest.raises(PoolFormatError, match=r"pool.jsonl.gz: truncated or corrupt gzip \(EOFError"):
        load_pool(path, g_ext=1)
    bad_crc = bytearray(data)
    bad_crc[-8] ^= 0xFF  # the CRC32 in the trailer
    path.write_bytes(bytes(bad_crc))
    with pytest.raises(PoolFormatError,
                       match=r"pool.jsonl.gz: truncated or corrupt gzip \(BadGzipFile: CRC check failed"):
        load_pool(path, g_ext=1)
    path.write_bytes(b"not gzip at all\n")
    with pytest.raises(PoolFormatError, match=r"pool.jsonl.gz: truncated or corrupt gzip \(BadGzipFile"):
        load_pool(path, g_ext=1)
    bad_data = bytearray(data)
    bad_data[len(data) // 2] ^= 0xFF  # inside the deflate stream
    path.write_bytes(bytes(bad_data))
    with pytest.raises(PoolFormatError, match=r"pool.jsonl.gz: truncated or corrupt gzip|pool.jsonl.gz:\d+: "):
        load_pool(path, g_ext=1)


def test_header_lone_surrogate_is_rejected(tmp_path):
    path = tmp_path / "pool.jsonl"
    path.write_text('{"lit_rl_pool": 1, "task": "sudoku", "policy": "q\\ud800"}\n' + json.dumps(GOOD) + "\n",
                    encoding="utf-8")
    with pytest.raises(PoolFormatError, match=r"pool.jsonl:1: header field 'policy' is not valid Unicode"):
        load_pool(path, g_ext=1)
