"""4-bit runs resume, validate and export from their checkpoints (the paper's LLaDA configs are all 4-bit).

Before the fix every ``fit --ckpt_path`` / ``validate --ckpt_path`` of a 4-bit run failed with "Unexpected
key(s) in state_dict: ...weight.absmax, ...weight.quant_map, ...weight.quant_state.bitsandbytes__nf4".
Checkpoints now leave the frozen NF4 base out (:mod:`lit_rl.models.frozen_state`). Here a 4-bit + LoRA ERILS
run interrupted after its first rollout batch and resumed from ``last.ckpt`` must end bitwise equal to the
uninterrupted run (adapters and optimizer state), on CPU, in this process.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("bitsandbytes")

from lit_rl.cli import run_lightning_cli  # noqa: E402
from lit_rl.models.frozen_state import KEY, drop_frozen_4bit, expect_frozen_4bit  # noqa: E402

from support.callbacks import BatchCounter, find  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests/fixtures/tiny_llada"

pytestmark = pytest.mark.slow


def fit(out: Path, max_steps: int, ckpt_path: Path | None = None, command: str = "fit", overlay: Path | None = None,
        path: Path = FIXTURE):
    args = [
        command,
        "--config", str(ROOT / "conf/erils.yaml"),
        "--config", str(ROOT / "tests/tiny_overlay.yaml"),
        "--config", str(overlay or ROOT / "tests/models/tiny_llada_4bit.yaml"),
        "--config", str(ROOT / "tests/exact_rollouts.yaml"),  # the remote-code fixture has no KV-cached forward
        f"--model.init_args.policy.init_args.path={path}",
        f"--trainer.default_root_dir={out}",
        f"--trainer.logger.init_args.tracking_uri=sqlite:///{out}/mlflow.db",
        f"--data.init_args.pool_path={ROOT}/data/pools/sudoku_scripted.jsonl.gz",
    ]
    if command == "fit":
        args += [
            f"--trainer.max_steps={max_steps}",
            "--trainer.callbacks+=support.callbacks.BatchCounter",
            "--trainer.callbacks+=callbacks.resume.ExactResume",
            "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
            f"--trainer.callbacks.dirpath={out}/checkpoints",
            "--trainer.callbacks.save_last=true",
            "--trainer.callbacks.every_n_train_steps=2",
        ]
    if ckpt_path is not None:
        args.append(f"--ckpt_path={ckpt_path}")
    torch.manual_seed(0)
    return run_lightning_cli(args)


def trained_state(cli) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in cli.model.named_parameters() if p.requires_grad}


def optimizer_state(cli) -> list[torch.Tensor]:
    opt = cli.trainer.optimizers[0]
    return [v.clone() for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]


def native_overlay(out: Path) -> Path:
    """tiny_llada_4bit.yaml with the paper configs' class, NativeLLaDA (no trust_remote_code)."""
    text = (ROOT / "tests/models/tiny_llada_4bit.yaml").read_text()
    text = (text.replace("lit_rl.models.PretrainedDiffusionLM", "lit_rl.models.NativeLLaDA")
            .replace("        trust_remote_code: true\n", ""))
    out.mkdir(parents=True, exist_ok=True)
    (out / "native_4bit.yaml").write_text(text)
    return out / "native_4bit.yaml"


@pytest.fixture(scope="module", params=["remote_fixture", "native_official"])
def runs(request, tmp_path_factory):
    """(ref, first half, saved checkpoint, resumed, folder): the committed remote-code fixture, and the paper
    default NativeLLaDA on a tiny checkpoint written by the official LLaDA code (skipped without ../shared)."""
    base = tmp_path_factory.mktemp(f"resume4bit_{request.param}")
    kw = {}
    if request.param == "native_official":
        from support.reference import tiny_official_llada

        kw = {"overlay": native_overlay(base), "path": tiny_official_llada(base / "official")}
    ref = fit(base / "ref", max_steps=4, **kw)
    first = fit(base / "part", max_steps=2, **kw)
    ckpt = base / "part/checkpoints/last.ckpt"
    saved = torch.load(ckpt, map_location="cpu", weights_only=False)
    resumed = fit(base / "part", max_steps=4, ckpt_path=ckpt, **kw)
    return ref, first, saved, resumed, base, kw


def test_checkpoint_leaves_the_frozen_4bit_base_out(runs):
    _, first, saved, _, _, _ = runs
    keys = saved["state_dict"].keys()
    assert not [k for k in keys if "absmax" in k or "quant_" in k or k.endswith("base_layer.weight")]
    assert any("lora_A" in k for k in keys)
    assert saved[KEY]["weights"] == 2 * 7 and saved[KEY]["entries"] >= 2 * 2 * 7  # weight + quant state per layer


def test_resume_continues_bitwise_like_the_uninterrupted_run(runs):
    ref, first, _, resumed, _, _ = runs
    assert first.trainer.global_step == 2 and resumed.trainer.global_step == ref.trainer.global_step == 4
    # the resumed process ran only the second rollout batch, from step 2 (the checkpoint was really loaded)
    counter = find(resumed.trainer, BatchCounter)
    assert (counter.batches, counter.first_step) == (1, 2) and find(ref.trainer, BatchCounter).batches == 2
    want, got = trained_state(ref), trained_state(resumed)
    assert want.keys() == got.keys() and len(want) == 4 * 7
    halfway = trained_state(first)
    assert any(not torch.equal(halfway[n], want[n]) for n in want)  # the second half did train
    for n in want:
        assert torch.equal(got[n], want[n]), n
    for a, b in zip(optimizer_state(resumed), optimizer_state(ref), strict=True):
        assert torch.equal(a, b)


def test_validate_from_a_4bit_checkpoint_evaluates_the_checkpoint_weights(runs):
    _, _, _, _, base, kw = runs
    ckpt = base / "part/checkpoints/last.ckpt"  # the resumed run's (step 4)
    saved = torch.load(ckpt, map_location="cpu", weights_only=False)
    cli = fit(base / "val", max_steps=0, ckpt_path=ckpt, command="validate", **kw)
    assert "val/sudoku/greedy/accuracy" in cli.trainer.callback_metrics
    state = cli.model.state_dict()
    adapters = [k for k in saved["state_dict"] if "lora_" in k]
    assert adapters and all(torch.equal(state[k], saved["state_dict"][k]) for k in adapters)


def test_checkpoint_missing_an_adapter_is_refused_like_a_strict_load(runs):
    ref, _, saved, _, _, _ = runs
    broken = {"state_dict": dict(saved["state_dict"]), KEY: saved[KEY]}
    victim = next(k for k in broken["state_dict"] if "lora_A" in k)
    del broken["state_dict"][victim]
    with pytest.raises(RuntimeError, match=r"missing \['" + victim.replace(".", r"\.")):
        expect_frozen_4bit(ref.model, broken)


def test_a_checkpoint_that_still_holds_the_base_loads_and_another_base_stops_a_fit(runs, monkeypatch):
    ref, _, _, _, _, _ = runs
    full = {"state_dict": ref.model.state_dict()}  # as written before the fix: with absmax / quant_map
    assert any("absmax" in k for k in full["state_dict"])
    expect_frozen_4bit(ref.model, full)
    assert not any("absmax" in k for k in full["state_dict"]) and ref.model.strict_loading is False
    ckpt = {"state_dict": ref.model.state_dict()}
    drop_frozen_4bit(ref.model, ckpt)
    ckpt[KEY]["fingerprint"] = "0" * 32
    with pytest.warns(UserWarning, match="4-bit base weights loaded from policy.path differ"):
        expect_frozen_4bit(ref.model, ckpt)  # validate / test: a warning
    with pytest.raises(RuntimeError, match="would not continue the same run"):
        expect_frozen_4bit(ref.model, ckpt, resuming_fit=True)
    monkeypatch.setenv("LIT_RL_ALLOW_NEW_BASE", "1")
    with pytest.warns(UserWarning, match="continuing on the new base"):
        expect_frozen_4bit(ref.model, ckpt, resuming_fit=True)
