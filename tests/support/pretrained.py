"""Probes shared by the remote-code dLLM tests (tests/models/test_pretrained.py for the LLaDA fixture,
tests/models/test_dream.py for the Dream one): build a 4-bit + LoRA policy on a fixture, give its adapters
values, take a fixed loss's adapter gradients, run an evaluation pass, fit a few ERILS steps via the CLI."""

from __future__ import annotations

from pathlib import Path

import torch

from lit_rl.models import LoraSettings, PretrainedDiffusionLM, QuantizationSettings

ROOT = Path(__file__).resolve().parents[2]

# one long and one short prompt: the short one is left-padded
PROMPTS = [[{"role": "user", "content": "1030040200310040"}], [{"role": "user", "content": "12"}]]


def build_pretrained(
    fixture: Path, lora_dropout: float = 0.0, gradient_checkpointing: bool = False, seed: int = 0, **kw
) -> PretrainedDiffusionLM:
    """The fixture in 4-bit NF4 (float32 compute) with r=8 LoRA adapters, seeded."""
    torch.manual_seed(seed)
    return PretrainedDiffusionLM(
        str(fixture),
        mask_id=None,
        eos_id=None,
        dtype="float32",
        quantization=QuantizationSettings(compute_dtype="float32"),
        lora=LoraSettings(r=8, alpha=16, dropout=lora_dropout),
        gradient_checkpointing=gradient_checkpointing,
        **kw,
    )


def randomize_adapters(policy: PretrainedDiffusionLM, seed: int = 1) -> None:
    """peft initialises lora_B to zero (so lora_A grads are 0 at init): give every adapter weight a value."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in sorted(policy.named_parameters()):
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


def adapter_grads(policy: PretrainedDiffusionLM) -> dict[str, torch.Tensor]:
    """Gradients of a fixed loss (masked-token log-likelihood of a left-padded batch) w.r.t. the adapters."""
    ids, mask = policy.encode_prompts(PROMPTS)  # (2, P) left-padded
    ids = ids.clone()
    ids[:, -4:] = policy.mask_id  # the last positions masked, as in the surrogate's forward passes
    policy.train()
    policy.zero_grad(set_to_none=True)
    logp = torch.log_softmax(policy(ids, mask).float(), -1)[:, -4:]  # (2, 4, V)
    target = torch.arange(4).expand(2, 4) + 40
    (-logp.gather(-1, target[..., None]).mean()).backward()
    return {n: p.grad.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}


def assert_trap(policy: PretrainedDiffusionLM, want: dict[str, torch.Tensor]) -> str:
    """The bitsandbytes packing trap, in either of its forms, after an unguarded eval pass packed ``policy``'s
    4-bit weights: without native AVX512-BF16 the packed weights give WRONG gradients (most adapters differ
    from ``want``); with it, bitsandbytes' fused CPU kernel raises "a view of a leaf Variable that requires
    grad is being used in an in-place operation" in the backward. Returns which form was seen."""
    import warnings

    with warnings.catch_warnings():  # torch: "bitsandbytes::gemv_4bit: an autograd kernel was not registered"
        warnings.simplefilter("ignore", UserWarning)
        try:
            got = adapter_grads(policy)
        except RuntimeError as err:
            assert "leaf Variable" in str(err) and "in-place" in str(err), err
            return "error"
    wrong = [n for n in want if not torch.allclose(got[n], want[n], rtol=1e-4, atol=1e-5)]
    assert len(wrong) > len(want) // 2, f"only {len(wrong)} of {len(want)} adapter gradients changed"
    return "wrong_gradients"


def eval_pass(policy: PretrainedDiffusionLM) -> None:
    """What Lightning's sanity check / greedy evaluation does to the policy: eval mode, no grad."""
    ids, mask = policy.encode_prompts(PROMPTS)
    policy.eval()
    with torch.no_grad():
        policy(ids, mask)
    policy.train()


def fit_tiny_erils(fixture: Path, overlay: str, out: Path):
    """4 ERILS updates (tests/tiny_overlay.yaml) through the real CLI with the 4-bit + LoRA policy on
    ``fixture`` (``overlay``: tests/models/tiny_<name>_4bit.yaml), sanity check on; returns the CLI."""
    from lit_rl.cli import run_lightning_cli

    torch.manual_seed(0)
    return run_lightning_cli([
        "fit",
        "--config", str(ROOT / "conf/erils.yaml"),
        "--config", str(ROOT / "tests/tiny_overlay.yaml"),
        "--config", str(ROOT / overlay),
        f"--model.init_args.policy.init_args.path={fixture}",
        f"--trainer.default_root_dir={out}",
        f"--trainer.callbacks.init_args.dirpath={out}/checkpoints",
        "--trainer.num_sanity_val_steps=1",
        f"--trainer.logger.init_args.tracking_uri=sqlite:///{out}/mlflow.db",
        f"--data.init_args.pool_path={ROOT}/data/pools/sudoku_scripted.jsonl.gz",
        "--config", str(ROOT / "tests/exact_rollouts.yaml"),  # a checkpoint's own forward has no KV cache
    ])
