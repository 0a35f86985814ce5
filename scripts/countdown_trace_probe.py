"""Which Countdown traces can the tiny dLLM learn to write? A masked-denoising SFT probe (docs/erils_countdown.md).

The embedded dLLM (``TinyDiffusionLM``, h128 x 4 layers, as ``conf/erils.yaml``) is trained from scratch on the
teacher's traces for the miniature Countdown problems, with LLaDA's SFT loss over the whole completion width
(EOS padding included, as the format warm-up and ``conf/erils_sft.yaml``), AdamW lr 1e-3, 32 rows per step.
Every ``--every`` steps it decodes the test problems greedily (low-confidence remasking, block 16, width/2
steps) and prints two shares: answers whose numbers are exactly the prompt's, in its order (``copy``), and
correct answers (``acc``). A JSON line with the curve ends the output.

Traces (``--trace``):

* ``copy``: ``<answer>a+b+c</answer>``: the prompt's numbers at fixed offsets, nothing to compute;
* ``trials``: the external model's teacher, ``--tries LO,HI`` wrong tries before the hit
  (:func:`lit_rl.tasks.scripted.countdown_trials_completion`), over expressions in the prompt's order
  (``--order prompt``, problems from ``CountdownTask(ordered=True)``) or in any order (``--order any``).

    python scripts/countdown_trace_probe.py --trace trials --order prompt --tries 0,0 --steps 1500
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from lit_rl.core.denoising import denoising_masks, masked_denoising_loss  # noqa: E402
from lit_rl.generation.diffusion import diffusion_generate  # noqa: E402
from lit_rl.models import TinyDiffusionLM  # noqa: E402
from lit_rl.tasks import CountdownTask  # noqa: E402
from lit_rl.tasks.countdown_problems import in_order  # noqa: E402
from lit_rl.tasks.scripted import countdown_trials_completion  # noqa: E402


def answer_in_order(text: str, numbers: list[int]) -> bool:
    """The completion's last ``<answer>`` writes exactly ``numbers``, in their order."""
    found = re.findall(r"<answer>(.*?)</answer>", text)
    return bool(found) and in_order(found[-1], numbers)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", choices=["copy", "trials"], default="trials")
    ap.add_argument("--order", choices=["prompt", "any"], default="prompt")
    ap.add_argument("--tries", default="0,0", help="LO,HI wrong tries before the hit (trials)")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--every", type=int, default=250, help="evaluate every N steps")
    ap.add_argument("--num-train", type=int, default=1000, help="training problems (the ERILS overlay's 1000)")
    ap.add_argument("--test", type=int, default=64, help="test problems decoded at each evaluation")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    lo, hi = (int(x) for x in args.tries.split(","))
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    ordered = args.order == "prompt"
    task = CountdownTask(num_train=args.num_train, number_range=[1, 9], target_range=[1, 30], test_size=args.test,
                         system_prompt="", question_template="{numbers}>{target}", ordered=ordered)
    policy = TinyDiffusionLM(hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512, max_positions=256,
                             seed=args.seed)
    width = 32 if args.trace == "copy" else 64

    def target(example, rng) -> str:
        if args.trace == "copy":
            return "<answer>" + "+".join(str(n) for n in example.meta["numbers"]) + "</answer>"
        return countdown_trials_completion(example, rng, (lo, hi), ordered=ordered)

    train, test = task.train_examples(), task.eval_examples()
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    rng, gen = random.Random(args.seed), torch.Generator().manual_seed(args.seed)

    def evaluate() -> tuple[float, float, str]:
        policy.eval()
        prompt, mask = policy.encode_prompts([task.messages(e) for e in test], 64)
        with torch.no_grad():
            out = diffusion_generate(lambda i, a: policy(i, a), prompt, mask, gen_length=width, block_length=16,
                                     steps=width // 2, temperature=0.0, mask_id=policy.mask_id)
        texts = policy.decode_completions(out[:, prompt.shape[1]:])
        policy.train()
        copy = sum(answer_in_order(t, e.meta["numbers"]) for t, e in zip(texts, test)) / len(test)
        acc = sum(task.reward(t, e) == 1.0 for t, e in zip(texts, test)) / len(test)
        return copy, acc, texts[0]

    curve, t0 = [], time.perf_counter()
    for step in range(args.steps + 1):
        if step % args.every == 0 or step == args.steps:
            copy, acc, sample = evaluate()
            curve.append({"step": step, "copy": copy, "acc": acc, "s": round(time.perf_counter() - t0, 1)})
            print(f"step {step:5d}  copy {copy:.3f}  acc {acc:.3f}  {time.perf_counter() - t0:6.0f}s  "
                  f"{sample[:70]!r}", flush=True)
        if step == args.steps:
            break
        batch = [train[rng.randrange(len(train))] for _ in range(32)]
        prompt, mask = policy.encode_prompts([task.messages(e) for e in batch], 64)
        comp, lengths = policy.encode_completions([target(e, rng) for e in batch], width)  # (B, W), (B,)
        t, masked = denoising_masks(torch.ones_like(comp, dtype=torch.bool), gen)  # the whole width, EOS included
        noisy = torch.where(masked, torch.full_like(comp, policy.mask_id), comp)
        logits = policy(torch.cat([prompt, noisy], 1), torch.cat([mask, torch.ones_like(comp)], 1))[:, prompt.shape[1]:]
        loss = masked_denoising_loss(logits, comp, masked, t, torch.full_like(lengths, width))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        opt.step()
    result = {"script": "countdown_trace_probe", **{k: v for k, v in vars(args).items()}, "curve": curve}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
