"""How good is an external model, before any pool is built: the go/no-go figures of the miniature Countdown.

Samples the build config's backend (the same :class:`~lit_rl.pools.backends.HFPoolBackend` path, seeds and
sampling as ``rollouts build``) on the task's *test* problems, with and without the config's length instruction,
and reports per mode:

- accuracy (the task's verifier reward is 1), format rate (an answer block), distinct completions per prompt;
- completion lengths in the external tokenizer and in the dLLM's character tokens (percentiles), and the share
  over the config's ``max_usable_tokens``;
- for Countdown trial traces, the arithmetic of each written step (``a op b = c``) and how often the last try
  claims the target (does the model stop on a hit, or after a learned number of tries?).

    .venv/bin/python scripts/external_lm_eval.py --config conf/external/countdown_ordered.yaml [--samples 4]

The last line printed is a JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_STEP = re.compile(r"([-\d/+*]+)=(-?\d+(?:/\d+)?)")
_NUM = re.compile(r"-?\d+(?:/\d+)?")


def _readings(lhs: str) -> list[Fraction]:
    """Every value of ``a op b`` in ``lhs`` over the ways to split it into two numbers (a fraction operand is
    written without brackets by the teacher: ``7/1/2`` is 7 / (1/2) when the inner step gave 1/2)."""
    out = []
    for k, op in enumerate(lhs):
        if k == 0 or op not in "+-*/" or lhs[k - 1] in "+-*/":
            continue
        a, b = lhs[:k], lhs[k + 1:]
        if _NUM.fullmatch(a) and _NUM.fullmatch(b):
            try:
                x, y = Fraction(a), Fraction(b)
            except (ValueError, ZeroDivisionError):
                continue
            if op != "/" or y != 0:
                out.append({"+": x + y, "-": x - y, "*": x * y}[op] if op != "/" else x / y)
    return out


def step_arithmetic(text: str) -> tuple[int, int]:
    """``(steps written right, steps written)`` over the ``a op b=c`` steps of a reasoning trace; a step is
    right when some reading of its unbracketed operands gives ``c``."""
    ok = total = 0
    trace = text.split("<reasoning>")[-1].split("</reasoning>")[0]
    for part in re.split(r"[;, ]+", trace):
        m = _STEP.fullmatch(part)
        if not m:
            continue
        readings = _readings(m[1])
        if not readings:
            continue
        try:
            c = Fraction(m[2])
        except (ValueError, ZeroDivisionError):
            continue
        total += 1
        ok += int(c in readings)
    return ok, total


def percentiles(values: Sequence[int], qs: Sequence[int] = (50, 90, 95, 99)) -> dict[str, float]:
    s = sorted(values)
    return {f"p{q}": float(s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]) for q in qs} if s else {}


def evaluate(cfg: Any, samples: int, limit: int | None) -> dict[str, Any]:
    from lit_rl.models.tokenizer import build_char_tokenizer
    from lit_rl.pools.backends import GenRequest, build_backend, request_seed
    from lit_rl.pools.build_config import build_task
    from lit_rl.pools.length_control import LengthControl

    task = build_task(cfg.task_spec)
    backend = build_backend(cfg.backend_spec)
    ext_tok, char_tok = backend.length_tokenizer(), build_char_tokenizer()
    examples = task.eval_examples()[:limit] if limit else task.eval_examples()
    out: dict[str, Any] = {"model": cfg.backend_spec.get("model"), "problems": len(examples), "samples": samples,
                           "temperature": cfg.sampling.temperature, "max_usable_tokens": cfg.max_usable_tokens}
    for mode in ("none", "instruction"):
        control = LengthControl(mode=mode, instruction=cfg.length_control.instruction,
                                target_total_tokens=cfg.length_control.target_total_tokens)
        reqs = [GenRequest(messages=control.first_stage_messages(task, e), seed=request_seed(cfg.seed, e.id, j, "eval"),
                           group=f"{e.id}/{mode}") for e in examples for j in range(samples)]
        res = backend.generate(reqs, cfg.sampling)
        texts = [r.text.strip() for r in res]
        exs = [e for e in examples for _ in range(samples)]
        rewards = [task.reward(t, e) for t, e in zip(texts, exs)]
        ext_len = [len(ext_tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
        char_len = [len(char_tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
        arith = [step_arithmetic(t) for t in texts]
        claims = [t.split("</reasoning>")[0].rstrip().endswith(f"={e.meta.get('target')}") for t, e in zip(texts, exs)
                  if "</reasoning>" in t] if task.name == "countdown" else []
        per_prompt = [len(set(texts[i:i + samples])) for i in range(0, len(texts), samples)]
        out[mode] = {
            "accuracy": sum(r == task.max_reward for r in rewards) / len(rewards),
            "any_correct_of_samples": sum(any(r == task.max_reward for r in rewards[i:i + samples])
                                          for i in range(0, len(rewards), samples)) / len(examples),
            "format_rate": sum("<answer>" in t and "</answer>" in t for t in texts) / len(texts),
            "distinct_per_prompt": sum(per_prompt) / len(per_prompt),
            "ext_tokens_mean": sum(ext_len) / len(ext_len), "ext_tokens": percentiles(ext_len),
            "char_tokens_mean": sum(char_len) / len(char_len), "char_tokens": percentiles(char_len),
            "over_limit": sum(n > cfg.max_usable_tokens for n in ext_len) / len(ext_len),
            "hit_max_tokens": sum(r.finish_reason == "length" for r in res) / len(res),
            "step_arithmetic": sum(a for a, _ in arith) / max(1, sum(n for _, n in arith)),
            "last_try_claims_target": sum(claims) / len(claims) if claims else None,
            "examples": texts[:3],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    from lit_rl.pools.build_config import load_build_config

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="build config (conf/external/*.yaml) with an hf backend")
    p.add_argument("--samples", type=int, default=4, help="T-1 samples per test problem and mode")
    p.add_argument("--limit", type=int, default=None, help="only the first N test problems")
    args = p.parse_args(argv)
    res = evaluate(load_build_config(args.config), args.samples, args.limit)
    for mode in ("none", "instruction"):
        r = res[mode]
        print(f"{mode:>11}: accuracy {r['accuracy']:.3f} (any of {args.samples}: {r['any_correct_of_samples']:.3f}), "
              f"format {r['format_rate']:.3f}, distinct {r['distinct_per_prompt']:.2f}/{args.samples}, "
              f"external tokens mean {r['ext_tokens_mean']:.1f} {r['ext_tokens']}, over {res['max_usable_tokens']}: "
              f"{r['over_limit']:.3f}; char tokens mean {r['char_tokens_mean']:.1f} {r['char_tokens']}; "
              f"step arithmetic {r['step_arithmetic']:.3f}; last try claims the target {r['last_try_claims_target']}")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
