"""Parity figures of the native LLaDA / Dream against the official remote code (docs/models.md table).

    python scripts/reference_parity.py        # needs ../shared/reference_models (the official files)

Builds the tiny random checkpoints of ``tests/support/reference.py`` from the official code, then prints,
for float32 and bfloat16, the max |logit difference| of: native vs official without padding; each
left-padded row vs the prompt alone (native, and the official code given the same batch). JSON on stdout.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from lit_rl.generation.diffusion import position_ids_from_attention_mask  # noqa: E402
from lit_rl.models.dream import NativeDreamModel, qwen2_config_from_dream  # noqa: E402
from lit_rl.models.llada import NativeLLaDAConfig, NativeLLaDAModel  # noqa: E402
from lit_rl.models.policy import additive_key_mask  # noqa: E402
from lit_rl.models.remote_compat import load_remote_model  # noqa: E402
from support.reference import left_padded, tiny_official_dream, tiny_official_llada  # noqa: E402


def native(name: str, path: Path, dtype: torch.dtype):
    if name == "llada":
        return NativeLLaDAModel.from_pretrained(path, config=NativeLLaDAConfig.from_llada_json(path), dtype=dtype)
    return NativeDreamModel.from_pretrained(path, config=qwen2_config_from_dream(path), dtype=dtype)


def official_batch(name: str, ref, ids, mask, dtype):
    if name == "llada":  # what a user passes; the official code ignores it
        return ref(input_ids=ids, attention_mask=mask).logits
    # Dream's official forward needs an SDPA mask and position ids (what PretrainedDiffusionLM passes)
    return ref(input_ids=ids, attention_mask=additive_key_mask(mask).to(dtype),
               position_ids=position_ids_from_attention_mask(mask)).logits


def main() -> None:
    out = {}
    tmp = Path(tempfile.mkdtemp(prefix="lit_rl_parity_"))
    for name, build in (("llada", tiny_official_llada), ("dream", tiny_official_dream)):
        path = build(tmp / name)
        for dtype in (torch.float32, torch.bfloat16):
            ref, nat = load_remote_model(str(path), dtype=dtype).eval(), native(name, path, dtype).eval()
            rows, ids, mask = left_padded()
            full = left_padded(seed=1, lens=(11, 11, 11))[1]
            T = ids.shape[1]
            with torch.no_grad():
                want = ref(input_ids=full).logits.float()
                nopad = (want - nat(input_ids=full).logits.float()).abs().max().item()
                bn = nat(input_ids=ids, attention_mask=mask).logits.float()
                br = official_batch(name, ref, ids, mask, dtype).float()
                pn = pr = 0.0
                for i, r in enumerate(rows):
                    alone = ref(input_ids=r[None]).logits[0].float()
                    pn = max(pn, (bn[i, T - len(r):] - alone).abs().max().item())
                    pr = max(pr, (br[i, T - len(r):] - alone).abs().max().item())
            out[f"{name}/{str(dtype).removeprefix('torch.')}"] = {
                "no_pad_native_vs_official": nopad, "padded_native_vs_alone": pn,
                "padded_official_vs_alone": pr, "logit_scale": want.abs().max().item(),
            }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
