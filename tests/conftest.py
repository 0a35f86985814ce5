"""Shared test setup: quiet, deterministic, 1-2 CPU threads."""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

import torch  # noqa: E402

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

# LIT_RL_FORCE_AVX512BF16=1|0 forces bitsandbytes' AVX512-BF16 detection (the 4-bit CPU weight packing in
# Linear4bit) on or off for the whole in-process suite, so a machine without the feature can run the suite
# as one with it would, and the reverse: the suite must pass both ways and natively.
_FORCE_BF16 = os.environ.get("LIT_RL_FORCE_AVX512BF16")
if _FORCE_BF16 not in (None, "", "0", "1"):
    raise RuntimeError(f"LIT_RL_FORCE_AVX512BF16 must be 0 or 1, got {_FORCE_BF16!r}")
if _FORCE_BF16 in ("0", "1"):
    import bitsandbytes.nn.modules as _bnb_modules  # noqa: E402

    _bnb_modules.has_avx512bf16 = lambda _on=_FORCE_BF16 == "1": _on


import re  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import yaml  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def overlay_bases(path: Path) -> list[str]:
    """The configs an overlay goes on top of, in order, as the first header line that names it gives them
    (``--config conf/<base>.yaml [--config conf/<overlay>.yaml ...] --config <this file>``); ``[]`` for a full
    config (it has ``model.class_path`` and ``data.class_path``)."""
    raw = yaml.safe_load(path.read_text()) or {}
    # a full config names both classes; an overlay may switch the module class (e.g. the SFT baseline)
    if (raw.get("model") or {}).get("class_path") is not None and (raw.get("data") or {}).get("class_path") is not None:
        return []
    from lit_rl.config.preflight import named_bases  # the rule `fit` uses to name an overlay's bases

    bases = named_bases(path)
    if bases:
        return bases
    raise AssertionError(f"{path}: an overlay must name the configs it goes on in a usage line "
                         f"(--config conf/<base>.yaml --config conf/<this overlay>.yaml)")


def training_parser():
    """The arguments of ``python -m lit_rl fit`` as LightningCLI parses them, without building anything."""
    from jsonargparse import ActionConfigFile
    from lightning.pytorch import LightningDataModule, LightningModule, Trainer
    from lightning.pytorch.cli import LightningArgumentParser

    parser = LightningArgumentParser()
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_lightning_class_args(LightningModule, "model", subclass_mode=True)
    parser.add_lightning_class_args(LightningDataModule, "data", subclass_mode=True)
    parser.add_argument("--seed_everything", type=int | bool | None, default=None)
    parser.add_argument("--threads", type=int | None, default=None)
    parser.add_argument("--overwrite", type=bool, default=False)
    parser.add_argument("--ckpt_path", type=str | None, default=None)  # fit's own argument (reproduce passes last)
    parser.add_lightning_class_args(Trainer, "trainer")
    return parser


@pytest.fixture
def parse_training_config(monkeypatch):
    """``parse(path)``: the LightningCLI parse of a training config without building it (an overlay on
    top of the configs its usage line names), run from the repository root."""
    monkeypatch.chdir(ROOT)
    make_parser = training_parser

    from lit_rl.config.edits import expand_list_edits  # an overlay's callbacks~ edits, as `fit` expands them

    def parse(path: Path):
        parser = make_parser()
        bases = overlay_bases(path)
        if not bases:
            return parser.parse_path(str(path))
        return parser.parse_args(expand_list_edits([*(a for base in bases for a in ("--config", base)),
                                                    "--config", str(path)]))

    parse.bases = overlay_bases
    parse.argv = lambda argv: make_parser().parse_args(expand_list_edits(argv))  # a `fit` command line, sans `fit`
    return parse


@pytest.fixture(scope="session")
def postgres_server():
    """A throwaway PostgreSQL server on 127.0.0.1 for the session (tests/support/postgres.py); skipped with
    the reason when it cannot start, failed instead under ``CI=true``."""
    from support.postgres import start_or_skip

    server = start_or_skip()
    yield server
    server.cleanup()


@pytest.fixture
def postgres_url(postgres_server, request):
    """The SQLAlchemy URL of a fresh database on :func:`postgres_server` (up again if a test stopped it)."""
    if not postgres_server.running():
        postgres_server.start()
    postgres_url.count = getattr(postgres_url, "count", 0) + 1
    name = f"t{postgres_url.count}_" + re.sub(r"[^a-z0-9_]", "_", request.node.name.lower())[:48]
    return postgres_server.create_database(name)


@pytest.fixture(scope="session")
def resume_base(tmp_path_factory):
    """A short ERILS run stopped at update 4 with its checkpoints (tests/support/resume_runs.py): the resume tests copy
    it, never change it; one fit per session for every module that resumes from it."""
    from support.resume_runs import fit_base

    return fit_base(tmp_path_factory.mktemp("truth"))
