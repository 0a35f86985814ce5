"""Tests lit_rl/pools/build_config.py."""

from pathlib import Path

import pytest
import yaml

from lit_rl.pools.build_config import BuildConfigError, load_build_config, resolve_env

ROOT = Path(__file__).resolve().parents[2]


def test_config_errors_are_clear(tmp_path, monkeypatch):
    monkeypatch.delenv("LIT_RL_EXTERNAL_URL", raising=False)
    with pytest.raises(BuildConfigError, match=r"backend.base_url uses \$\{LIT_RL_EXTERNAL_URL\}, "
                       r"but the environment variable LIT_RL_EXTERNAL_URL is not set"):
        load_build_config(ROOT / "conf/external/sudoku.yaml")
    assert resolve_env({"a": "${NOPE_NOT_SET:-dflt}/v1", "b": "$x$ ${x}"}) == {"a": "dflt/v1", "b": "$x$ ${x}"}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"task": "sudoku", "out": "x", "backend": {"type": "scripted", "task": "sudoku"},
                                   "temprature": 1}))
    with pytest.raises(BuildConfigError, match=r"unknown key\(s\) \['temprature'\]"):
        load_build_config(bad)
    bad.write_text(yaml.safe_dump({"task": "sudoku", "out": "x", "backend": {"type": "scripted", "task": "sudoku"},
                                   "n": 2, "g_ext": 3}))
    with pytest.raises(BuildConfigError, match="g_ext=3 > n=2"):
        load_build_config(bad)


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "conf/external").glob("*.yaml")))
def test_every_external_config_parses(name, monkeypatch):
    monkeypatch.setenv("LIT_RL_EXTERNAL_URL", "http://vllm-host:8000/v1")
    monkeypatch.setenv("LIT_RL_MATH_TRAIN", "/data/math_train.jsonl")
    cfg = load_build_config(ROOT / "conf/external" / name)
    assert cfg.n >= cfg.g_ext
    if name == "countdown_ordered.yaml":  # the miniature: the limit scaled to the tiny dLLM (erils_countdown.md)
        assert cfg.max_usable_tokens < 500 and cfg.length_control.target_total_tokens == 48
        assert cfg.external_lm["teacher"] == "countdown_ordered_trials" and cfg.backend_spec["type"] == "hf"
        assert cfg.task_spec["init_args"]["ordered"] is True
    else:
        assert cfg.max_usable_tokens == 500 and cfg.length_control.target_total_tokens == 256
    if name in ("sudoku.yaml", "countdown.yaml", "math500.yaml"):  # the paper's settings (Table III)
        assert cfg.backend_spec["type"] == "openai" and cfg.backend_spec["base_url"] == "http://vllm-host:8000/v1"
        assert (cfg.backend_spec["model"] == "Qwen/Qwen3-30B-A3B-Instruct-2507"
                and cfg.length_tokenizer == "Qwen/Qwen3-30B-A3B-Instruct-2507")
        assert (cfg.n, cfg.seed, cfg.sampling.temperature) == (6, 42, 1.0)
        assert cfg.sampling.max_tokens == (4096 if name == "sudoku.yaml" else 2048)
        assert cfg.length_control.mode == ("two_stage" if name == "sudoku.yaml" else "instruction")
        assert cfg.mlflow["tracking_uri"].startswith("sqlite:///")


def _bad_config(tmp_path, text):
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    return path


BASE = "task: sudoku\nbackend: {type: scripted, task: sudoku}\n"


@pytest.mark.parametrize(
    "text, message",
    [
        (BASE + "out: x.jsonl.gz\n", r"bad.yaml: out='x.jsonl.gz': builders write plain JSONL; drop .gz"),
        (BASE + "out: x.jsonl\nn: true\n", r"bad.yaml: n=True: must be an integer >= 1"),
        (BASE + "out: x.jsonl\ng_ext: true\n", r"bad.yaml: g_ext=True: must be an integer >= 1"),
        (BASE + "out: x.jsonl\nlimit: true\n", r"bad.yaml: limit=True: must be null or an integer >= 0"),
        (BASE + "out: x.jsonl\nseed: true\n", r"bad.yaml: seed=True: must be an integer"),
        ("task: {class_path: lit_rl.tasks.SudokuTask, init_args: [1]}\nbackend: {type: scripted, task: sudoku}\n"
         "out: x.jsonl\n", r"bad.yaml: task.init_args=\[1\]: expected a mapping"),
        (BASE + "out: null\n", r"bad.yaml: out=None: expected the pool's file path"),
        (BASE + "out: x.jsonl\nsampling: {temperature: hot}\n",
         r"bad.yaml: sampling.temperature='hot': must be a number"),
        (BASE + "out: x.jsonl\nsampling: {max_tokens: 1.5}\n",
         r"bad.yaml: sampling.max_tokens=1.5: must be an integer"),
        (BASE + "out: x.jsonl\nsampling: {temprature: 1}\n",
         r"bad.yaml: sampling: .*unexpected keyword argument 'temprature'"),
        (BASE + "out: x.jsonl\nsampling: [1]\n", r"bad.yaml: sampling: expected a mapping, got list"),
        (BASE + "out: x.jsonl\nlength_control: {target_total_tokens: true}\n",
         r"bad.yaml: length_control.target_total_tokens=True: must be an integer >= 1"),
        (BASE + "out: [x\n", r"(?s)bad.yaml: invalid YAML: while parsing a flow sequence\n  in \".*bad.yaml\", line 3"),
    ],
)
def test_config_type_errors_name_file_and_key(tmp_path, text, message):
    with pytest.raises(BuildConfigError, match=message):
        load_build_config(_bad_config(tmp_path, text))


def test_gz_out_override_is_refused(tmp_path):
    with pytest.raises(BuildConfigError, match=r"bad.yaml: out=.*x.jsonl.gz'?: builders write plain JSONL; drop .gz"):
        load_build_config(_bad_config(tmp_path, BASE + "out: x.jsonl\n"), {"out": str(tmp_path / "x.jsonl.gz")})
