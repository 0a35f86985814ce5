"""``python -m lit_rl export``: PEFT adapters (and a merged model) from a training checkpoint.

    python -m lit_rl export --ckpt_path runs/erils_sudoku/checkpoints/last.ckpt --out exports/erils_sudoku --merge

See :mod:`lit_rl.models.export`.
"""

from __future__ import annotations

import sys

from lit_rl.cli_args import LitArgumentParser
from lit_rl.errors import CheckpointError, ConfigError
from lit_rl.models.export import export_policy


def main(argv: list[str] | None = None) -> int:
    ap = LitArgumentParser(
        prog="python -m lit_rl export",
        description="Export a trained policy from a Lightning checkpoint: LoRA adapters in PEFT format "
        "(<out>/adapter, loadable by PeftModel.from_pretrained) and, with --merge, the base model with the "
        "adapters merged in (<out>/merged, loadable by AutoModel.from_pretrained; a causal LM's by "
        "AutoModelForCausalLM and vLLM). dLLM (ERILS) and causal (double-rollout GRPO) policies alike.",
    )
    ap.add_argument("--ckpt_path", "--ckpt", required=True,
                    help="Lightning checkpoint (e.g. runs/<run>/checkpoints/last.ckpt)")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--merge", action="store_true", help="also write the merged full-precision model")
    ap.add_argument("--config", default=None,
                    help="the run's config.yaml (default: found next to/above the checkpoint)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                    help="dtype of the exported base")
    args = ap.parse_args(argv)
    try:
        manifest = export_policy(args.ckpt_path, args.out, merge=args.merge, config=args.config, dtype=args.dtype)
    except (CheckpointError, ConfigError, FileNotFoundError) as e:  # one line, exit 2 (as the other commands)
        print(f"error: {e}", file=sys.stderr)
        return 2
    for key in ("adapter", "merged"):
        if key in manifest:
            print(f"{key}: {manifest[key]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
