"""Every YAML under conf/ parses, and every training config validates with the LightningCLI parser.

An overlay (a training config without ``model.class_path``) is validated on top of the configs its usage
line names before it (``--config conf/<base>.yaml [--config conf/<overlay>.yaml ...] --config conf/<this>.yaml``).
"""

from pathlib import Path

import pytest
import yaml


ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(p for p in (ROOT / "conf").rglob("*.yaml"))
TRAIN_CONFIGS = [p for p in CONFIGS if "model" in (yaml.safe_load(p.read_text()) or {})]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_yaml_parses(path):
    assert isinstance(yaml.safe_load(path.read_text()), dict)


@pytest.mark.parametrize("path", TRAIN_CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_training_config_validates_with_lightning_cli(path, parse_training_config):
    """The LightningCLI parser accepts the config (types, class paths, argument names) without building it."""
    cfg = parse_training_config(path)
    assert cfg.model.class_path and cfg.data.class_path


def _merged(path: Path, bases: list[str]) -> dict:
    """The raw YAML of a training config on top of its ``bases`` when it is an overlay (dicts merged, lists
    replaced)."""

    def merge(a, b):
        if isinstance(a, dict) and isinstance(b, dict):
            return ({k: merge(a.get(k), v) if k in a else v for k, v in b.items()}
                    | {k: v for k, v in a.items() if k not in b})
        return b

    merged: dict = {}
    for file in [*(ROOT / b for b in bases), path]:
        merged = merge(merged, yaml.safe_load(Path(file).read_text()))
    return merged


# eval set sizes of configs with ``eval_size: null`` (the whole set): MATH500, Sudoku
# SPG's Sudoku test split; d1's Countdown set
FULL_EVAL_SIZES = {"lit_rl.tasks.MathTask": 500, "lit_rl.tasks.SudokuTask": 256, "lit_rl.tasks.CountdownTask": 256}


@pytest.mark.parametrize("path", TRAIN_CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_rank_gets_an_eval_batch(path, parse_training_config):
    """Under DDP/FSDP each rank takes every W-th eval batch and needs at least one (a rank without any makes
    Lightning fail at fit start): ceil(eval_size / eval_batch_size) >= devices * num_nodes."""
    cfg = _merged(path, parse_training_config.bases(path))
    trainer, data = cfg.get("trainer") or {}, (cfg.get("data") or {}).get("init_args") or {}
    devices = trainer.get("devices", 1)
    world = (devices if isinstance(devices, int) else 1) * int(trainer.get("num_nodes", 1) or 1)
    size = data.get("eval_size", 128)
    if size is None:
        size = FULL_EVAL_SIZES.get((data.get("task") or {}).get("class_path"))
        if size is None:
            pytest.skip("eval set size unknown without loading the task")
    batches = -(-size // int(data.get("eval_batch_size", 32)))
    assert batches >= world, f"{path.name}: {batches} eval batch(es) for {world} ranks (data.eval_batch_size)"


@pytest.mark.parametrize("name", ["erils_sudoku", "erils_countdown", "erils_math500", "spg_sudoku", "spg_countdown",
                                  "spg_math500"])
def test_paper_spg_configs_follow_the_stated_batch_reading_and_spg_mix_betas(name, parse_training_config):
    # SPG's mix scripts (facebookresearch/SPG slurm_scripts/spg_mix): --eubo_beta Sudoku 1.0, Countdown 1.5,
    # math 1.5 (2.0 is the Countdown EUBO-only value); ERILS Table VIII read as one 6-rollout group per GPU.
    # The SPG configs are overlays on the ERILS ones: resolved, they keep the same reading with G_on 6.
    task = name.split("_")[1]
    cfg = parse_training_config(ROOT / "conf/paper" / f"{name}.yaml")
    sur, data = cfg.model.init_args.surrogate.init_args, cfg.data.init_args
    want_beta = {"sudoku": 1.0, "countdown": 1.5, "math500": 1.5}[task]
    assert (sur.mode, sur.beta, sur.w) == ("mix", want_beta, 0.5)
    assert data.prompts_per_batch * (data.g_on + data.g_ext) == 6  # rollouts per GPU per update
    assert (data.g_on, data.g_ext) == ((6, 0) if name.startswith("spg") else (4, 2))
    assert cfg.trainer.devices == 8 and cfg.model.init_args.updates_per_batch == 12
    assert "Batch reading" in (ROOT / "conf/paper" / f"erils_{task}.yaml").read_text()


@pytest.mark.parametrize("base", ["conf/erils.yaml --config conf/erils_study_recipe.yaml",
                                  "conf/paper/erils_sudoku.yaml"])
def test_fast_rollouts_overlay_caches_rollouts_only(base, parse_training_config):
    base = base.split(" --config ")
    plain = parse_training_config.argv([a for b in base for a in ("--config", b)])
    argv = [a for b in base for a in ("--config", b)]
    cfg = parse_training_config.argv(argv + ["--config", "conf/fast_rollouts.yaml"])
    gen, plain_gen = cfg.data.init_args.generation, plain.data.init_args.generation
    assert gen.cache == "dual" and plain_gen.cache == "none"
    assert (gen.gen_length, gen.steps, gen.temperature) == (plain_gen.gen_length, plain_gen.steps,
                                                            plain_gen.temperature)
    assert cfg.data.init_args.eval_generation == plain.data.init_args.eval_generation


def test_embedded_default_decodes_with_the_cache_and_threshold_and_the_overlays_restore_the_reference(
        parse_training_config):
    fast = parse_training_config.argv(["--config", "conf/erils.yaml"]).data.init_args
    exact = parse_training_config.argv(["--config", "conf/erils.yaml", "--config", "conf/exact_decoding.yaml"])
    exact = exact.data.init_args
    gen = fast.generation  # rollouts: dual cache + threshold over the fixed schedule
    assert (gen.cache, gen.threshold, gen.threshold_floor, gen.steps) == ("dual", 0.9, "schedule", 12)
    ev = fast.eval_generation  # greedy evaluation: uncached, threshold over the fixed schedule
    assert (ev.cache, ev.threshold, ev.threshold_floor, ev.steps) == ("none", 0.9, "schedule", 24)
    for g in (exact.generation, exact.eval_generation):
        assert (g.cache, g.threshold) == ("none", None)  # the reference decoder
    assert (exact.generation.steps, exact.eval_generation.steps) == (gen.steps, ev.steps)
    # the sampled checkpoint Pass@k keeps the reference decoder: what the committed studies' pass@k measured
    (passk,) = [c for c in parse_training_config.argv(["--config", "conf/erils.yaml"]).trainer.callbacks
                if c.class_path == "callbacks.PassAtKEvaluation"]
    (multi,) = passk.init_args.configs
    assert multi["generation"] == {"gen_length": 48, "block_length": 16, "steps": 24, "temperature": 0.9}


def test_embedded_default_lr_schedule_and_the_study_recipe(parse_training_config):
    """conf/erils.yaml: lr 2e-3 peak, 8 warm-up updates, cosine to 0 at max_steps; conf/erils_study_recipe.yaml
    restores what the committed studies ran (constant 1e-3, exact rollouts) and nothing else."""
    new = parse_training_config.argv(["--config", "conf/erils.yaml"])
    old = parse_training_config.argv(["--config", "conf/erils.yaml", "--config", "conf/erils_study_recipe.yaml"])
    sched = new.model.init_args.scheduler
    assert sched.class_path == "lit_rl.optim.WarmupCosine" and new.model.init_args.optimizer.init_args.lr == 0.002
    assert (sched.init_args.warmup_steps, sched.init_args.total_steps) == (8, None)  # ends at trainer.max_steps
    assert old.model.init_args.scheduler.class_path == "lit_rl.optim.ConstantWithWarmup"
    assert old.model.init_args.optimizer.init_args.lr == 0.001
    assert (old.data.init_args.generation.cache, old.data.init_args.generation.threshold) == ("none", None)
    assert old.data.init_args.eval_generation == new.data.init_args.eval_generation
    assert old.trainer == new.trainer and old.data.init_args.g_ext == new.data.init_args.g_ext


PAPER_GRPO = ["double_rollout_math", "grpo_math", "grpo_large_math"]
NEMO_RL_ADVANTAGE = {"scale_std": True, "leave_one_out": True, "std_of": "baseline", "std_eps": 1e-6}


@pytest.mark.parametrize("name", PAPER_GRPO)
def test_paper_double_rollout_and_grpo_configs_use_nemo_rls_grpo_advantage(name, parse_training_config):
    """The DR paper's GRPO baseline is NeMo-RL's (normalize_rewards + use_leave_one_out_baseline of its
    examples/configs/grpo_math_1B.yaml; docs/double_rollout.md "The GRPO baseline"); the configs parse with it
    and the settings class accepts it."""
    from lit_rl.algorithms.losses import GRPOLossSettings

    loss = vars(parse_training_config(ROOT / "conf/paper" / f"{name}.yaml").model.init_args.loss)
    assert {k: loss[k] for k in NEMO_RL_ADVANTAGE} == NEMO_RL_ADVANTAGE
    assert GRPOLossSettings(**loss).std_of == "baseline"
    assert "grpo_math_1B.yaml" in (ROOT / "conf/paper/double_rollout_math.yaml").read_text()  # the base says why


@pytest.mark.parametrize("name", ["double_rollout", "double_rollout_chainsum", "grpo", "grpo_chainsum", "grpo_large",
                                  "grpo_large_chainsum"])
def test_embedded_and_testbed_grpo_configs_keep_the_mean_centred_default(name, parse_training_config):
    loss = vars(parse_training_config(ROOT / "conf" / f"{name}.yaml").model.init_args.loss)
    assert (loss["scale_std"], loss["leave_one_out"], loss["std_of"], loss["std_eps"]) == (False, False, "group", 1e-4)


@pytest.mark.parametrize("path", TRAIN_CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_training_config_passes_the_preflight(path, parse_training_config, monkeypatch):
    """What `fit` checks before anything loads (lit_rl.config.preflight, without the data reads): every shipped
    training config starts (an overlay on top of the base its usage line names)."""
    from lit_rl.config.preflight import preflight

    monkeypatch.chdir(ROOT)
    bases = parse_training_config.bases(path)
    argv = ["fit", *(a for base in bases for a in ("--config", base)), "--config", str(path.relative_to(ROOT))]
    assert preflight(argv, data=False) is not None


@pytest.mark.parametrize("method", [[], ["conf/grpo_chainsum.yaml"], ["conf/grpo_large_chainsum.yaml"]])
def test_guess_testbed_overlay_changes_only_the_task_warm_start_and_eval_cadence(method, parse_training_config,
                                                                                 monkeypatch, tmp_path):
    from lit_rl.config.preflight import preflight

    monkeypatch.chdir(ROOT)
    chainsum = ["--config", "conf/double_rollout.yaml", "--config", "conf/double_rollout_chainsum.yaml"]
    argv = [*chainsum, "--config", "conf/double_rollout_guess.yaml"]
    argv += [a for m in method for a in ("--config", m)]
    cfg = parse_training_config.argv(argv)
    plain = parse_training_config.argv([*chainsum,
                                        *[a for m in method for a in ("--config", m)]])
    assert cfg.data.init_args.task.init_args.answer_mod == 2 and plain.data.init_args.task.init_args.answer_mod is None
    cbs = {c.class_path.rsplit(".", 1)[-1]: c.init_args for c in cfg.trainer.callbacks}
    assert cbs["ScriptedSFTWarmup"].trace == "guessing" and cbs["ScriptedSFTWarmup"].steps == 1500
    assert cbs["PassAtKEvaluation"].every_n_steps % cfg.model.init_args.updates_per_batch == 0
    assert cbs["PassAtKEvaluation"].every_n_steps <= 5  # steps to best: evaluated at least every 5 updates
    assert cfg.model.init_args.double_rollout == plain.model.init_args.double_rollout
    assert cfg.model.init_args.loss == plain.model.init_args.loss
    assert cfg.data.init_args.num_generations == plain.data.init_args.num_generations
    assert preflight(["fit", *argv], data=False) is not None
    from lit_rl.reproduce.dr import study_plan

    (nemo_job, *_) = study_plan("guess").entries_of("nemo")  # the study's NeMo-RL runs: their overlay on the testbed
    overlay = tmp_path / "nemo.yaml"
    overlay.write_text(yaml.safe_dump(nemo_job.overlay[0]))
    nemo = vars(parse_training_config.argv([*argv, "--config", str(overlay)]).model.init_args.loss)
    assert (nemo["scale_std"], nemo["leave_one_out"], nemo["std_of"], nemo["std_eps"]) == (True, True, "baseline", 1e-6)
