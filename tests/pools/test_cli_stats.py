"""lit_rl/pools/cli.py: pool statistics (ERILS Tables IV, V, XII) on hand-made pools with known answers; files
next to the pool; MLflow logging (sqlite); the ``rollouts stats`` / ``rollouts build`` CLI."""

import json
import os
from pathlib import Path

import pytest

from lit_rl.pools.build import build_info_path
from lit_rl.pools.cli import check_tracking_uri, format_duration, main, pool_stats, stats_markdown
from lit_rl.pools.pool import PoolRecord, _header, reorder_usable_first, write_pool_atomic

ROOT = Path(__file__).resolve().parents[2]

# (final length, final reward, stage-1 length, stage-1 reward) per candidate, in generation order
POOL = {
    "p0": [(100, 1.0, 1000, 1.0), (600, 1.0, 1200, 0.0), (200, 0.0, 900, 0.0)],
    "p1": [(501, 1.0, 2000, 1.0), (700, 1.0, 2000, 1.0), (50, 1.0, 2000, 1.0)],
    "p2": [(10, 0.5, 800, 0.5), (20, 1.0, 800, 1.0), (30, 1.0, 800, 1.0)],
}


def _write(path, pool=POOL, two_stage=True, **header):
    recs = []
    for pid, cands in pool.items():
        group = [
            PoolRecord(pid, j, "ext", f"c{j}", r, n, "qwen3", meta={"candidate": j, **(
                {"stage1": {"completion": "long", "reward": r1, "num_tokens": n1}} if two_stage else {})})
            for j, (n, r, n1, r1) in enumerate(cands)
        ]
        recs += reorder_usable_first(group)
    write_pool_atomic(path, _header("sudoku", "Qwen/Qwen3-30B-A3B-Instruct-2507", "qwen3", n=3, g_ext=2,
                                    max_usable_tokens=500, max_reward=1.0, length_control={"mode": "two_stage"},
                                    **header), recs)
    return path


def test_tables_iv_and_v_by_hand(tmp_path):
    path = _write(tmp_path / "pool.jsonl")
    build_info_path(path).write_text(json.dumps({
        "generation_wall_time_s": 16733.0, "sessions": [{"requests": 18, "retries": 2}, {"requests": 4, "retries": 0}],
        "status": "complete"}))
    s = pool_stats(path)
    # >500: 600, 501, 700; default usable: p0 (100, 200) and p2 (all) but not p1 (only 50); all-3 valid: p2
    assert s["table_iv"] == {"task": "sudoku", "source_prompts": 3, "generated_completions": 9, "over_max_tokens": 3,
                             "default_usable": 2, "all_n_valid": 1, "n": 3, "g_ext": 2, "max_tokens": 500}
    final, first, used = s["table_v"]["final"], s["table_v"]["first_stage"], s["table_v"]["default_training"]
    # final: lengths sum 2211 / 9; rewards 7.5 / 9; correct (reward 1.0): 7
    assert (final["completions"] == 9 and final["mean_length"] == pytest.approx(2211 / 9)
            and final["mean_reward"] == pytest.approx(7.5 / 9))
    assert final["correct"] == 7 and final["correct_pct"] == pytest.approx(700 / 9)
    # first stage: lengths 3100 + 6000 + 2400 = 11500; rewards 6.5; correct 6
    assert (first["mean_length"] == pytest.approx(11500 / 9) and first["mean_reward"] == pytest.approx(6.5 / 9)
            and first["correct"] == 6)
    # default training set: p0 -> c0 (100, 1.0), c2 (200, 0.0); p2 -> c0 (10, 0.5), c1 (20, 1.0)
    assert (used["completions"] == 4 and used["mean_length"] == pytest.approx(82.5)
            and used["mean_reward"] == pytest.approx(0.625) and used["correct"] == 2)
    # p0: c0 kept, c1 became correct, c2 stayed wrong; p1: 3 kept; p2: c0 stayed wrong, 2 kept
    assert s["two_stage_transitions"] == {"kept_correct": 6, "became_correct": 1, "became_incorrect": 0,
                                          "stayed_incorrect": 2}
    assert s["generation"] == {"wall_time_s": 16733.0, "wall_time": "4h 38m 53s", "sessions": 2, "requests": 22,
                               "retries": 2, "status": "complete"}
    # the old flat keys stay
    assert (s["source_prompts"], s["completions"], s["over_500_tokens"], s["usable_prompts_g_ext_2"],
            s["all_valid_prompts"], s["correct"]) == (3, 9, 3, 2, 1, 7)
    md = stats_markdown(s)
    assert "| sudoku | 3 | 9 | 3 | 2 | 1 |" in md
    assert "| First stage | 9 | 1,277.78 | 0.7222 | 6 (66.67%) |" in md
    assert "| Second stage (final) | 9 | 245.67 | 0.8333 | 7 (77.78%) |" in md
    assert "| Default training set (first 2 usable) | 4 | 82.50 | 0.6250 | 2 (50.00%) |" in md
    assert "| 4h 38m 53s | 2 | 22 | 2 |" in md and "Warning" not in md


def test_other_limits_and_g_ext(tmp_path):
    path = _write(tmp_path / "pool.jsonl")
    s = pool_stats(path, g_ext=1, max_tokens=150)  # usable: 100, 50, 10, 20, 30
    assert (s["table_iv"]["over_max_tokens"] == 4 and s["table_iv"]["default_usable"] == 3
            and s["table_iv"]["all_n_valid"] == 1)
    s = pool_stats(path, g_ext=3)
    assert s["table_iv"]["default_usable"] == 1


def test_single_stage_math_pool_and_char_fallback(tmp_path):
    path = tmp_path / "math.jsonl"
    recs = reorder_usable_first([PoolRecord("m0", j, "ext", "c", r, 10, "chars")
                                 for j, r in enumerate([3.0, 2.0, 1.0])])
    # no max_reward: from the task
    write_pool_atomic(path, _header("math500", "ext", "chars", length_unit="chars", length_fallback=True), recs)
    s = pool_stats(path)
    assert "first_stage" not in s["table_v"] and s["two_stage_transitions"] is None
    # correct = a correct answer (MATH's 2.0 correctness term), whatever its format credit: 3.0 and 2.0, not 1.0
    assert s["max_reward"] == 3.0 and s["correct_reward"] == 2.0 and s["table_v"]["final"]["correct"] == 2
    assert s["generation"]["wall_time"] == "-"
    md = stats_markdown(s)
    assert "| Final | 3 |" in md and "lengths in CHARACTERS" in md and "**Warning**" in md


def test_files_next_to_the_pool_and_cli(tmp_path, capsys):
    path = _write(tmp_path / "sudoku_qwen3.jsonl")
    assert main(["stats", str(path)]) == 0
    out = capsys.readouterr()
    assert "| sudoku | 3 | 9 | 3 | 2 | 1 |" in out.out
    md, js, png = (tmp_path / f"sudoku_qwen3.{x}" for x in ("stats.md", "stats.json", "lengths.png"))
    assert md.read_text().startswith("## External rollout pool") and png.read_bytes()[:4] == b"\x89PNG"
    assert json.loads(js.read_text())["table_iv"]["default_usable"] == 2
    assert main(["stats", str(path), "--json", "--no_write", "--g_ext", "3"]) == 0
    assert json.loads(capsys.readouterr().out)["table_iv"]["default_usable"] == 1
    assert main(["stats", str(tmp_path / "missing.jsonl")]) == 2
    assert "pool file not found" in capsys.readouterr().err


def test_mlflow_sqlite_only(tmp_path):
    with pytest.raises(ValueError, match="use a sqlite:/// URI"):
        check_tracking_uri(str(tmp_path / "mlruns"))
    with pytest.raises(ValueError, match="file store is not supported"):
        check_tracking_uri("file:///tmp/mlruns")
    assert format_duration(3725.4) == "1h 02m 05s"


def test_build_cli_writes_stats_and_logs_to_mlflow(tmp_path, capsys):
    import mlflow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    out = tmp_path / "emb.jsonl"
    rc = main(["build", "--config", str(ROOT / "conf/external/sudoku_embedded.yaml"), "--out", str(out), "--limit", "5",
               "--no_progress", "--mlflow_uri", uri])
    assert rc == 0
    printed = capsys.readouterr().out
    summary = json.loads(printed.splitlines()[0])
    assert summary["prompts_done"] == 5 and summary["requests"] == 60  # 5 prompts x 6 candidates x 2 stages
    assert "### Filtering (ERILS Table IV)" in printed and "| First stage | 30 |" in printed
    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("lit_rl-external-pools")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.data.metrics["pool/source_prompts"] == 5 and run.data.metrics["pool/generated_completions"] == 30
    assert run.data.params["policy"] == "scripted-sudoku" and run.data.params["length_control"] == "two_stage"
    assert "pool/generation_wall_time_s" in run.data.metrics
    assert sorted(a.path for a in client.list_artifacts(run.info.run_id)) == [
        "emb.lengths.png", "emb.stats.json", "emb.stats.md"]
    # rerunning resumes: nothing to generate
    assert main(["build", "--config", str(ROOT / "conf/external/sudoku_embedded.yaml"), "--out", str(out),
                 "--limit", "5", "--no_progress", "--no_stats"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["prompts_generated"] == 0


def test_build_cli_reports_config_errors(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("LIT_RL_EXTERNAL_URL", raising=False)
    assert main(["build", "--config", str(ROOT / "conf/external/sudoku.yaml")]) == 2
    assert "LIT_RL_EXTERNAL_URL is not set" in capsys.readouterr().err


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda lines: lines[:1] + [lines[1].replace('"meta": {', '"meta": "abc", "x": {')] + lines[2:],
         "pool.jsonl:2: field 'meta' must be an object"),
        (lambda lines: lines[:2] + [lines[1]] + lines[2:],
         "pool.jsonl:3: duplicate record prompt_id 'p0' index 0, first at line 2"),
        (lambda lines: ["[" * 100_000 + "\n"] + lines[1:], "pool.jsonl:1: header: invalid JSON"),
        (lambda lines: [lines[0].replace('"g_ext": 2', '"g_ext": [2]')] + lines[1:],
         "pool.jsonl:1: header field 'g_ext' must be an integer >= 1, got [2]"),
        (lambda lines: lines[:1] + [lines[1].replace('"num_tokens": 1000', '"num_tokens": [1000]')] + lines[2:],
         "pool.jsonl:2: field 'meta.stage1' must be an object"),
    ],
)
def test_stats_cli_reports_bad_pools_and_writes_nothing(tmp_path, capsys, mutate, message):
    path = _write(tmp_path / "pool.jsonl")
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(mutate(lines)))
    assert main(["stats", str(path)]) == 2
    assert message in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pool.jsonl"]


def test_stats_cli_reports_a_damaged_gzip(tmp_path, capsys):
    import gzip

    data = gzip.compress(_write(tmp_path / "plain.jsonl").read_bytes())
    path = tmp_path / "pool.jsonl.gz"
    path.write_bytes(data[:-10])
    assert main(["stats", str(path)]) == 2
    assert f"{path}: truncated or corrupt gzip (EOFError" in capsys.readouterr().err


def test_stats_files_are_replaced_atomically(tmp_path, monkeypatch):
    # every file goes to a temp name in the same folder and is renamed over the final name; a failure
    # before the rename leaves the old file (here: none) and no temp file
    import lit_rl.pools.cli as cli

    path = _write(tmp_path / "pool.jsonl")
    stats = pool_stats(path)
    renamed = []
    real_replace = os.replace

    def replace(src, dst):
        renamed.append((Path(src).name, Path(dst).name))
        if str(dst).endswith(".png"):
            raise OSError("disk full")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)  # lit_rl.atomic renames with os.replace
    with pytest.raises(OSError, match="disk full"):
        cli.write_stats(stats, path)
    assert [dst for _, dst in renamed] == ["pool.stats.md", "pool.stats.json", "pool.lengths.png"]
    assert all(src.startswith(f".{dst}.") and src.endswith(".partial") for src, dst in renamed)  # temp names
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pool.jsonl", "pool.stats.json", "pool.stats.md"]
