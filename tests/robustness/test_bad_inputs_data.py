"""Nothing changes silently:

* prompts longer than ``max_prompt_len`` are cut, counted (``train/prompts_truncated``) and warned about once per run;
* an external row that cannot fit the policy's positions is refused when the pool meets the policy, with the pool's
  file:line (not an ``IndexError`` at the first update);
* a surrogate ``block_length`` that does not divide ``L_gen`` gets the same refusal as in ``generation``;
* ``prompts_per_batch`` larger than the training set, and duplicate prompt ids, are refused;
* ``score`` on an empty file is one error line and exit 2 (not accuracy 0.0).
"""

from __future__ import annotations

import contextlib
import io
import json
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from datamodules import RolloutDataModule
from lit_rl import cli
from lit_rl.errors import ConfigError
from lit_rl.generation.settings import DecodeSettings
from lit_rl.models import TinyDiffusionLM
from lit_rl.tasks import SudokuTask

ROOT = Path(__file__).resolve().parents[2]
POOL = ROOT / "data/pools/sudoku_scripted.jsonl.gz"
TINY = dict(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)


def _dm(**kw) -> RolloutDataModule:
    task = SudokuTask(system_prompt="", question_template="{puzzle}", num_train=1000)
    args = dict(pool_path=str(POOL), num_train_prompts=20, prompts_per_batch=2, g_on=1, g_ext=1,
                generation=DecodeSettings(16, 16, 2, 1.0), max_prompt_len=64, eval_size=4)
    args.update(kw)
    dm = RolloutDataModule(task, **args)
    dm.setup()
    return dm


def _fit(tmp: Path, overlay: Path) -> list[str]:
    return ["fit", "--config", str(ROOT / "conf/erils.yaml"), "--config", str(ROOT / "tests/tiny_overlay.yaml"),
            f"--trainer.default_root_dir={tmp}/run", f"--data.init_args.pool_path={POOL}", "--config", str(overlay)]


def _run(args: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            rc = cli.main(args)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
    return rc, err.getvalue()


def test_truncated_prompts_are_counted_and_warned_about_once():
    torch.manual_seed(0)
    dm = _dm(max_prompt_len=8)  # a Sudoku prompt is ~30 tokens
    policy = TinyDiffusionLM(**TINY, max_positions=256)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dm.produce_rollouts(dm.prompt_batch(0), policy)
        first = dict(dm.last_stats)
        dm.produce_rollouts(dm.prompt_batch(1), policy)
    cut = [w for w in caught if "max_prompt_len = 8" in str(w.message)]
    assert len(cut) == 1, [str(w.message) for w in caught]
    assert "keep only their last 8 tokens" in str(cut[0].message)
    assert first["train/prompts_truncated"] == 2.0 and dm.last_stats["train/prompts_truncated_total"] == 4.0
    assert dm.prompts_truncated == 4


def test_an_external_row_that_cannot_fit_the_positions_is_refused_with_the_pool_line():
    dm = _dm(g_on=0, g_ext=2, max_external_len=512)
    policy = TinyDiffusionLM(**TINY, max_positions=48)  # prompt (~30) + a scripted trace (>100 tokens) cannot fit
    with pytest.raises(ConfigError) as err:
        dm.produce_rollouts(dm.prompt_batch(0), policy)
    msg = str(err.value)
    assert f"{POOL}:" in msg and "policy tokens" in msg and "max_positions = 48" in msg, msg
    assert "set max_external_len <=" in msg, msg


def test_a_surrogate_block_that_does_not_divide_the_generation_is_refused(tmp_path):
    overlay = tmp_path / "bad.yaml"
    overlay.write_text("model:\n  init_args:\n    surrogate:\n      init_args:\n        block_length: 24\n")
    rc, stderr = _run(_fit(tmp_path, overlay))
    errors = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    assert rc == 2 and len(errors) == 1, stderr[-2000:]
    assert f"{overlay}:5: model.init_args.surrogate.init_args.block_length: L_gen = 64 is not a multiple of the " \
           "surrogate's block_length = 24" in errors[0], errors[0]
    # the same rule when the module meets its data (a run built without the preflight)
    from lit_rl.algorithms.erils import ERILSModule
    from lit_rl.algorithms.surrogates import SPGSurrogate

    module = ERILSModule(TinyDiffusionLM(**TINY, max_positions=64), surrogate=SPGSurrogate(block_length=24))
    module._trainer = SimpleNamespace(datamodule=SimpleNamespace(generation=DecodeSettings(64, 32, 4, 1.0)))
    with pytest.raises(ConfigError, match="L_gen = 64 is not a multiple of the surrogate's block_length = 24"):
        module.setup("fit")


def test_a_batch_larger_than_the_training_set_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="prompts_per_batch: 30 prompts per batch, but the training set has 20"):
        _dm(prompts_per_batch=30)
    overlay = tmp_path / "bad.yaml"
    overlay.write_text("data:\n  init_args:\n    prompts_per_batch: 5000\n")
    rc, stderr = _run(_fit(tmp_path, overlay))
    errors = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    assert rc == 2 and len(errors) == 1 and f"{overlay}:3: data.init_args.prompts_per_batch: 5000" in errors[0], stderr
    assert not (tmp_path / "run").exists()


def test_duplicate_prompt_ids_are_refused_with_the_file_line(tmp_path):
    from lit_rl.tasks import PromptTask
    from lit_rl.tasks.base import Example, check_prompt_set

    rows = [{"id": "a", "prompt": "1+1", "answer": "2"}, {"id": "b", "prompt": "2+2", "answer": "4"},
            {"id": "a", "prompt": "3+3", "answer": "6"}]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"train.jsonl:3: id 'a' repeats .*train.jsonl:1"):
        PromptTask(train_path=str(path), id_column="id").train_examples()
    # any task: the stream's own check
    with pytest.raises(ValueError, match=r"prompt id 'x' is used twice in the training set \(prompts 1 and 3\)"):
        check_prompt_set([Example("x", "q", "a"), Example("y", "q", "a"), Example("x", "q", "a")], 1)


def test_score_of_an_empty_file_is_an_error(tmp_path):
    empty = tmp_path / "predictions.jsonl"
    empty.write_text("")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = cli.main(["score", "--task", "sudoku", "--generations", str(empty)])
    lines = err.getvalue().strip().splitlines()
    assert rc == 2 and len(lines) == 1 and f"{empty}: no generations in the file" in lines[0], err.getvalue()


def test_a_pool_refused_at_setup_leaves_no_run_and_no_run_folder(tmp_path):
    """The pool check needs the policy's tokenizer, so it runs when the DataModule meets the policy, after
    Lightning opened the MLflow run: that empty FAILED run (and the run folder holding only its record) used to
    stay; now the error line is the only trace."""
    import mlflow

    overlay = tmp_path / "long.yaml"
    overlay.write_text(  # the preflight's max_prompt_len + L_gen <= max_positions holds; a 48-token trace does not fit
        "model:\n  init_args:\n    policy:\n      init_args:\n        max_positions: 64\n"
        "data:\n  init_args:\n    max_external_len: 512\n    max_prompt_len: 32\n"
        "    generation: {gen_length: 32, block_length: 32, steps: 4, temperature: 1.0}\n"
        "    eval_generation: {gen_length: 32, block_length: 32, steps: 4, temperature: 0.0}\n")
    rc, stderr = _run(_fit(tmp_path, overlay) + [f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path}/m.db"])
    errors = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    assert rc == 2 and len(errors) == 1 and "max_positions = 64" in errors[0], stderr[-2000:]
    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path}/m.db")
    assert [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])] == []
    assert not (tmp_path / "run").exists()
