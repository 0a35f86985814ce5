"""The external LM trained here: its own BPE tokenizer, the length instruction in its SFT prompts, a model
directory that the pool builder's HF backend loads like any checkpoint, and the train-lm command."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml

from lit_rl.models.tokenizer import build_char_tokenizer
from lit_rl.pools import external_lm
from lit_rl.pools.backends import GenRequest, HFPoolBackend, Sampling
from lit_rl.pools.build import load_build_config
from lit_rl.pools.external_lm import ExternalLMSettings, train_bpe_tokenizer, train_external_lm
from lit_rl.pools.length_control import LengthControl
from lit_rl.tasks import CountdownTask
from lit_rl.tasks.scripted import countdown_trials_completion

TASK = dict(num_train=40, number_range=[1, 9], target_range=[1, 30], test_size=8, system_prompt="",
            question_template="{numbers}>{target}")
TINY = dict(vocab_size=300, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=256,
            steps=3, batch_size=4, max_completion_len=48, long_tries=(2, 8), brief_tries=(0, 1))


def test_bpe_tokenizer_is_deterministic_and_shorter_than_characters():
    task = CountdownTask(**TASK)
    texts = [countdown_trials_completion(e, random.Random(i), (1, 4)) for i, e in enumerate(task.train_examples())]
    a, b = train_bpe_tokenizer(texts, 300), train_bpe_tokenizer(texts, 300)
    assert a.get_vocab() == b.get_vocab()
    char = build_char_tokenizer()
    n_bpe = sum(len(a(t, add_special_tokens=False)["input_ids"]) for t in texts)
    n_char = sum(len(char(t, add_special_tokens=False)["input_ids"]) for t in texts)
    assert n_bpe < 0.95 * n_char  # merges: another unit than the dLLM's characters (whose tags are atomic)
    assert len(a("15", add_special_tokens=False)["input_ids"]) == 2  # digits one by one, as Llama's and Qwen's
    assert a.decode(a(texts[0], add_special_tokens=False)["input_ids"]) == texts[0]  # byte-level: lossless


@pytest.mark.parametrize("prompt", [
    {"system_prompt": "", "question_template": "{numbers}>{target}"},
    {},  # d1's system prompt joined to the question in one user message (CountdownTask's default)
    {"system_role": True},  # the system prompt as its own message
])
def test_instruction_prompts_are_the_builders_and_get_brief_traces(tmp_path, monkeypatch, prompt):
    base = {k: v for k, v in TASK.items() if k not in ("system_prompt", "question_template")}
    task = CountdownTask(**base, **prompt)
    control = LengthControl(mode="instruction", instruction="Be brief.")
    seen: list[tuple[list, str]] = []

    def spy_sft(policy, task_, examples, make_text, **kw):
        r = random.Random(0)
        seen.extend((task_.messages(e), make_text(e, r)) for e in examples)  # what the SFT tokenises
        return 0.0

    monkeypatch.setattr("lit_rl.algorithms.ar_sft.scripted_sft", spy_sft)
    train_external_lm(task, countdown_trials_completion, tmp_path / "lm", ExternalLMSettings(**TINY), control)
    builder = [control.first_stage_messages(task, e) for e in task.train_examples()]
    plain = [task.messages(e) for e in task.train_examples()]
    briefed = [(m, t) for m, t in seen if m in builder]
    assert briefed and len(briefed) < len(seen)  # both kinds (instruction_share 0.5)
    assert all(m in builder or m in plain for m, _ in seen)
    for m, text in seen:
        tries = text.split("<reasoning>")[1].split("</reasoning>")[0].split(", ")
        assert len(tries) <= 2 if m in builder else len(tries) >= 3  # brief (0-1 wrong) vs long (2-8 wrong)


def test_train_lm_refuses_to_replace_a_model_without_overwrite(tmp_path):
    task = CountdownTask(**TASK)
    (tmp_path / "lm").mkdir()
    (tmp_path / "lm.partial").mkdir()  # left by a killed run: cleared, not reused
    with pytest.raises(FileExistsError, match="overwrite"):
        train_external_lm(task, countdown_trials_completion, tmp_path / "lm", ExternalLMSettings(**TINY))
    train_external_lm(task, countdown_trials_completion, tmp_path / "lm", ExternalLMSettings(**TINY), overwrite=True)
    assert (tmp_path / "lm" / "model.safetensors").is_file()
    assert not (tmp_path / "lm.partial").exists() and not (tmp_path / "lm.old").exists()


def test_trained_model_directory_loads_in_the_hf_pool_backend(tmp_path):
    task = CountdownTask(**TASK)
    out = tmp_path / "lm"
    summary = train_external_lm(task, countdown_trials_completion, out, ExternalLMSettings(**TINY))
    assert not (tmp_path / "lm.partial").exists()
    assert json.loads((out / "external_lm.json").read_text())["final_loss"] == summary["final_loss"]
    backend = HFPoolBackend(model=str(out))
    ex = task.train_examples()[0]
    req = GenRequest(messages=task.messages(ex), seed=1, group="g")
    first = backend.generate([req], Sampling(temperature=1.0, max_tokens=8))
    assert backend.generate([req], Sampling(temperature=1.0, max_tokens=8)) == first  # seeded per group
    tok = backend.length_tokenizer()
    assert len(tok) == TINY["vocab_size"] and "[MASK]" not in tok.get_vocab()  # its own, not the char one


def _config(tmp_path: Path, **extra) -> Path:
    cfg = {"task": {"class_path": "lit_rl.tasks.CountdownTask", "init_args": TASK},
           "out": str(tmp_path / "pool.jsonl"), "n": 2, "g_ext": 1, "max_usable_tokens": 30,
           "sampling": {"temperature": 1.0, "max_tokens": 16},
           "length_control": {"mode": "instruction", "instruction": "Be brief."},
           "backend": {"type": "hf", "model": str(tmp_path / "lm"), "batch_size": 8},
           "external_lm": {"teacher": "countdown_trials", **TINY, "long_tries": [2, 3], "brief_tries": [0, 1]}}
    cfg.update(extra)
    path = tmp_path / "build.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_train_lm_then_build_from_one_config(tmp_path):
    from lit_rl.pools.cli import main

    path = _config(tmp_path)
    assert main(["train-lm", "--config", str(path)]) == 0
    assert (tmp_path / "lm" / "model.safetensors").is_file()
    assert main(["build", "--config", str(path), "--limit", "3", "--no_progress", "--mlflow_uri", "none"]) == 0
    lines = (tmp_path / "pool.jsonl").read_text().splitlines()
    assert len(lines) == 1 + 3 * 2  # header + 3 prompts x 2 candidates
    header = json.loads(lines[0])
    assert header["tokenizer"] != "lit_rl/char" and header.get("length_unit", "tokens") == "tokens"


@pytest.mark.parametrize("extra, message", [
    ({"external_lm": None}, "external_lm: missing"),
    ({"backend": {"type": "scripted", "task": "countdown"}}, "backend: train-lm writes backend.model"),
    ({"external_lm": {"teacher": "no_such"}}, "build.yaml: external_lm.teacher='no_such'"),
    ({"external_lm": {"stepz": 3}}, "external_lm: .*stepz"),
    ({"external_lm": {"brief_tries": [3, 1]}}, "external_lm.brief_tries"),
    ({"external_lm": {"long_tries": 3}}, "build.yaml: external_lm.long_tries: must be"),
])
def test_train_lm_config_errors_name_the_field(tmp_path, extra, message):
    cfg = load_build_config(_config(tmp_path, **extra))
    with pytest.raises(ValueError, match=message):
        external_lm.train_from_config(cfg)
    assert not (tmp_path / "lm").exists()


def test_build_config_rejects_a_non_mapping_external_lm(tmp_path):
    with pytest.raises(ValueError, match="external_lm: expected a mapping"):
        load_build_config(_config(tmp_path, external_lm=[1, 2]))


def test_eval_script_counts_steps_by_hand_and_reports_both_modes(tmp_path, capsys):
    from support.scripts import load_script

    script = load_script("scripts", "external_lm_eval")
    assert script.step_arithmetic("<reasoning>3*4=12;12-5=7, 2+2=5, 9/2=9/2;9/2-1=7/2</reasoning>") == (4, 5)
    assert script.step_arithmetic("<reasoning>1/2=1/2;7/1/2=14, 9--6=15, 5/-3=-5/3, 4*3=13</reasoning>") == (4, 5)
    assert script.percentiles([5, 1, 3, 2, 4]) == {"p50": 3.0, "p90": 5.0, "p95": 5.0, "p99": 5.0}
    path = _config(tmp_path)
    external_lm.train_from_config(load_build_config(path))
    assert script.main(["--config", str(path), "--samples", "2", "--limit", "3"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["problems"] == 3
    for mode in ("none", "instruction"):
        r = res[mode]
        assert 0 <= r["accuracy"] <= r["any_correct_of_samples"] <= 1 and 1 <= r["distinct_per_prompt"] <= 2
        assert r["ext_tokens_mean"] > 0 and r["char_tokens"]["p50"] >= 0
