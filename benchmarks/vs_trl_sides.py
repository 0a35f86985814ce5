"""The two sides of ``benchmarks/vs_trl.py``, each run in its own process: lit_rl's Lightning fit and TRL's
``GRPOTrainer``, from the same warm-started weights, timed the same way, scored by one evaluator.

How a step is split (both sides, the numbers ``vs_trl.py`` prints):

* **step wall**: from the end of one optimizer update to the end of the next (the first step: from the start
  of training). lit_rl: ``on_train_batch_end`` of a Lightning callback (the batch's rollouts are made in the
  DataModule's ``on_after_batch_transfer``, inside that window); TRL: ``TrainerCallback.on_step_end`` (after
  the optimizer step; ``_prepare_inputs`` generates inside ``training_step``).
* **generation**: time inside the sampling call. lit_rl: ``HFBackend._run`` (every rollout and continuation);
  TRL: ``GRPOTrainer._generate_single_turn`` (``model.generate`` plus its EOS masking).
* **scoring**: time inside the reward call. lit_rl: ``Task.total_rewards`` (the DataModule's one call per
  batch, and double rollout's continuations); TRL: ``GRPOTrainer._calculate_rewards``, which calls
  :func:`chainsum_reward`, the same ``Task.total_rewards``.
* **update**: the rest of the step: π_old / advantages / loss forward and backward, optimizer step, decoding
  text, logging and the framework's own bookkeeping.
* **rollout tokens/s**: completion tokens sampled (up to and including EOS) / generation time.
* **peak RSS**: ``ru_maxrss`` of the side's own process when training ends (before the held-out evaluation).
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
#: the chain-sum testbed: the embedded double-rollout default with the chain-sum overlay
BASE_CONFIGS = [ROOT / "conf/double_rollout.yaml", ROOT / "conf/double_rollout_chainsum.yaml"]
GRPO_OVERLAY = ROOT / "conf/grpo_chainsum.yaml"


# -- the shared testbed -------------------------------------------------------------------------------
def testbed() -> dict[str, Any]:
    """The settings both sides read from the chain-sum testbed's configs (one source of truth), composed as
    ``python -m lit_rl fit`` composes them."""
    from lit_rl.config.lines import compose_files

    cfg = compose_files(BASE_CONFIGS).data
    data = cfg["data"]["init_args"]
    model = cfg["model"]["init_args"]
    warm = next(c["init_args"] for c in cfg["trainer"]["callbacks"] if c["class_path"].endswith("ScriptedSFTWarmup"))
    return {
        "policy": model["policy"]["init_args"], "task": data["task"]["init_args"], "warmup": warm,
        "G": data["num_generations"], "prompts_per_batch": data["prompts_per_batch"],
        "max_new_tokens": data["generation"]["max_new_tokens"], "temperature": data["generation"]["temperature"],
        "max_prompt_len": data["max_prompt_len"], "lr": model["optimizer"]["init_args"]["lr"],
        "betas": model["optimizer"]["init_args"]["betas"],
        "grad_clip": model["grad_clip"], "loss": model["loss"], "threads": cfg.get("threads", 2),
    }


def _cli(args: list[str]):
    from lit_rl.cli import _set_threads, run_lightning_cli

    _set_threads()
    return run_lightning_cli(args, run=False)


def warm_start(cache_dir: Path, steps: int | None = None) -> Path:
    """The chain-sum warm start (``ScriptedSFTWarmup`` of the config, its own cache key and file; ``steps``
    replaces the config's SFT steps): run once, then read by both sides as ``init_checkpoint``."""
    from callbacks.ar_warmup import ScriptedSFTWarmup

    cli = _cli([*(a for c in BASE_CONFIGS for a in ("--config", str(c))), "--trainer.logger", "false",
                "--trainer.callbacks", "[]", "--trainer.default_root_dir", str(cache_dir / "warm_run")])
    settings = testbed()["warmup"] | ({"steps": steps} if steps else {})
    cb = ScriptedSFTWarmup(**settings, cache_dir=str(cache_dir))
    dm, policy = cli.datamodule, cli.model.policy
    dm.setup("fit")
    path = cb.cache_path(policy, dm)
    if not path.exists():
        trainer = SimpleNamespace(ckpt_path=None, global_step=0, datamodule=dm, is_global_zero=True)
        cb.on_fit_start(trainer, SimpleNamespace(policy=policy, device=torch.device("cpu")))
    return path


# -- one evaluator for both final models ----------------------------------------------------------------
def heldout_accuracy(model: torch.nn.Module, problems: int, samples: int, seed: int) -> float:
    """Mean correctness of ``samples`` T-1 completions on each of the first ``problems`` held-out chain-sum
    problems (``ChainSumTask.eval_examples``, none of them a training problem), through lit_rl's HF sampler
    with ``seed``; ``model`` is the trained ``LlamaForCausalLM`` of either side."""
    from lit_rl.generation.ar import HFBackend
    from lit_rl.models.ar import TinyCausalLM
    from lit_rl.tasks import ChainSumTask

    bed = testbed()
    policy = TinyCausalLM(**bed["policy"])
    policy.model.load_state_dict(model.state_dict())
    policy.eval()
    task = ChainSumTask(**bed["task"])
    examples = task.eval_examples()[:problems]
    ids, mask = policy.encode_prompts([task.messages(e) for e in examples], bed["max_prompt_len"])  # (B, P)
    with torch.no_grad():
        comp = HFBackend(policy).generate(ids, mask, max_new_tokens=bed["max_new_tokens"], temperature=1.0,
                                          n=samples, seed=seed)  # (B*samples, L) prompt-major
    texts = policy.decode_completions(comp)
    correct = [task.evaluate(t, examples[k // samples]).correct for k, t in enumerate(texts)]
    return sum(correct) / len(correct)


# -- timing ---------------------------------------------------------------------------------------------
class StepClock:
    """Per-step wall time and the seconds each timed call (``kind``) and the sampled tokens took inside it.
    ``gen`` and ``score`` make the split; the other kinds are a finer profile (nested inside the step, and some
    inside each other: see each side's list)."""

    def __init__(self) -> None:
        self.acc: dict[str, float] = {"gen": 0.0, "score": 0.0}
        self.tokens = 0
        self.steps: list[dict[str, Any]] = []
        self._mark, self._acc0, self._tok0 = 0.0, dict(self.acc), 0

    def start(self) -> None:
        self._mark, self._acc0, self._tok0 = time.perf_counter(), dict(self.acc), self.tokens

    def step_end(self) -> None:
        wall = time.perf_counter() - self._mark
        d = {k: v - self._acc0.get(k, 0.0) for k, v in self.acc.items()}
        self.steps.append({"wall_s": wall, "gen_s": d["gen"], "score_s": d["score"],
                           "update_s": wall - d["gen"] - d["score"], "tokens": self.tokens - self._tok0,
                           "profile_s": {k: v for k, v in d.items() if k not in ("gen", "score")}})
        self.start()

    def timed(self, fn, kind: str, count_tokens=None):
        """``fn`` wrapped: its time added to ``kind``, its sampled tokens counted."""
        depth = [0]
        self.acc.setdefault(kind, 0.0)

        def wrapper(*args, **kwargs):
            depth[0] += 1
            t0 = time.perf_counter()
            try:
                out = fn(*args, **kwargs)
            finally:
                depth[0] -= 1
            if depth[0] == 0:  # nested calls (a method calling itself through the wrapper) count once
                self.acc[kind] += time.perf_counter() - t0
                if count_tokens is not None:
                    self.tokens += count_tokens(out)
            return out

        return wrapper


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _row_tokens(ids: torch.Tensor, eos: int) -> int:
    """Tokens of EOS-filled rows ``(R, L)`` up to and including each row's first EOS."""
    is_eos = ids == eos
    first = torch.where(is_eos.any(-1), is_eos.float().argmax(-1), torch.full_like(is_eos[:, 0], ids.shape[1] - 1,
                                                                                   dtype=torch.long))
    return int((first + 1).sum())


# -- lit_rl ---------------------------------------------------------------------------------------------
def run_lit(steps: int, seed: int, warm: Path, out_dir: Path, double_rollout: bool,
            overrides: list[str]) -> dict[str, Any]:
    """lit_rl's Lightning fit of the chain-sum config (GRPO, or double rollout), μ 1, ``steps`` updates, no
    evaluation, checkpoint or logger during the timed steps; ``overrides``: ``KEY=VALUE`` config keys."""
    import lightning as L

    from datamodules.stream import PromptStreamDataModule
    from lit_rl.algorithms import rl_module
    from lit_rl.algorithms.losses import ClippedPGLoss
    from lit_rl.algorithms.rl_module import RLModule
    from lit_rl.generation.ar import HFBackend
    from lit_rl.tasks.chainsum import ChainSumTask

    overlay = {
        "seed_everything": seed,
        "trainer": {"max_steps": steps, "logger": False, "enable_checkpointing": False, "num_sanity_val_steps": 0,
                    "limit_val_batches": 0, "callbacks": [], "default_root_dir": str(out_dir / "lit_run")},
        "model": {"init_args": {"updates_per_batch": 1,
                                "policy": {"init_args": {"init_checkpoint": str(warm)}}}},
        "data": {"init_args": {"seed": seed}},
    }
    (out_dir / "lit_overlay.yaml").write_text(yaml.safe_dump(overlay))
    args = [a for c in BASE_CONFIGS for a in ("--config", str(c))]
    args += [] if double_rollout else ["--config", str(GRPO_OVERLAY)]
    args += ["--config", str(out_dir / "lit_overlay.yaml")]
    for kv in overrides:
        key, _, value = kv.partition("=")
        args += [f"--{key}", value]
    cli = _cli(args)
    clock = StepClock()
    eos = cli.model.policy.eos_id
    HFBackend._run = clock.timed(HFBackend._run, "gen", lambda out: _row_tokens(out[0], eos))
    ChainSumTask.total_rewards = clock.timed(ChainSumTask.total_rewards, "score")
    # profile: rollouts (the DataModule's rows: gen + score + decoding + stacking), stages (the DataModule's
    # dependent stages: double rollout's continuations, gen + score inside), processors (advantages, the
    # double-rollout estimate: no generation), prepare (the loss's fixed part: π_old forward unless the first
    # update makes it), optimizer_update (zero grads, loss forward + backward, clipping, step, logging), of which
    # loss_backward (the loss's forward + backward over micro-batches)
    for owner, name, kind in ((PromptStreamDataModule, "produce_rollouts", "rollouts"),
                              (PromptStreamDataModule, "run_stages", "stages"),
                              (rl_module, "run_processors", "processors"), (ClippedPGLoss, "prepare", "prepare"),
                              (RLModule, "optimizer_update", "optimizer_update"),
                              (RLModule, "loss_backward", "loss_backward")):
        setattr(owner, name, clock.timed(getattr(owner, name), kind))

    class Clock(L.Callback):
        def on_train_start(self, trainer, pl_module):
            clock.start()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            clock.step_end()

    cli.trainer.callbacks.append(Clock())
    t0 = time.perf_counter()
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    train_s = time.perf_counter() - t0
    assert cli.trainer.global_step == steps, (cli.trainer.global_step, steps)
    return {"steps": clock.steps, "train_s": train_s, "peak_rss_mb": _peak_rss_mb(),
            "model": cli.model.policy.model}


# -- TRL ------------------------------------------------------------------------------------------------
def trl_changed_settings(steps: int, seed: int | list[int], output_dir: str) -> list[dict[str, Any]]:
    """Every ``GRPOConfig`` field set away from TRL's default, with TRL's default and why (the rest: TRL's)."""
    bed = testbed()
    rows = bed["prompts_per_batch"] * bed["G"]
    return [
        dict(setting="output_dir", value=output_dir, default="trainer_output", reason="a throwaway folder"),
        dict(setting="max_steps", value=steps, default=-1, reason="the same number of RL steps as lit_rl"),
        dict(setting="seed", value=seed, default=42, reason="the run's seed, the same on both sides"),
        dict(setting="num_generations", value=bed["G"], default=8, reason="G of the testbed"),
        dict(setting="per_device_train_batch_size", value=rows, default=8,
             reason=f"one optimizer update per rollout batch of {bed['prompts_per_batch']} prompts x G "
                    "(lit_rl prompts_per_batch, one forward/backward over the whole batch, micro_batch_size null)"),
        dict(setting="max_completion_length", value=bed["max_new_tokens"], default=512,
             reason="the same max_new_tokens"),
        dict(setting="learning_rate", value=bed["lr"], default=1e-6, reason="the same learning rate"),
        dict(setting="adam_beta2", value=bed["betas"][1], default=0.999,
             reason="the same AdamW betas (0.9, 0.99)"),
        dict(setting="lr_scheduler_type", value="constant", default="linear",
             reason="lit_rl's config has no schedule (constant lr); linear decay would lower TRL's lr over the run"),
        dict(setting="epsilon_high", value=bed["loss"]["eps_high"], default=None,
             reason="the same clip range (eps_low 0.2, eps_high 0.28, DAPO clip-higher)"),
        dict(setting="scale_rewards", value="none", default="group",
             reason="the same advantages: lit_rl's config centres rewards on the group mean without dividing by "
                    "the std (loss.scale_std false, Dr. GRPO)"),
        dict(setting="mask_truncated_completions", value=bed["loss"]["mask_truncated"], default=False,
             reason="the same loss mask: lit_rl leaves truncated completions out (loss.mask_truncated)"),
        dict(setting="bf16", value=False, default=True,
             reason="the same numerics: lit_rl trains in float32 on the CPU (and TRL's default bf16 stops on a CPU: "
                    "'Your setup doesn't support bf16/gpu')"),
        dict(setting="gradient_checkpointing", value=False, default=True,
             reason="the same computation: lit_rl does not recompute activations (TRL's default trades ~20% "
                    "time for memory, which a 1M-parameter model does not need)"),
    ]


def chainsum_reward(completions: list[str], example_index: list[int], task: Any, examples: list[Any],
                    **kwargs: Any) -> list[float]:
    """TRL reward function (``reward_funcs`` signature): the chain-sum task's own verifier,
    ``Task.total_rewards``, on each completion's training problem (the dataset's ``example_index`` column)."""
    return task.total_rewards(completions, [examples[i] for i in example_index]).totals


def run_trl(steps: int, seed: int, warm: Path, out_dir: Path) -> dict[str, Any]:
    """TRL's ``GRPOTrainer`` on the chain-sum training problems, from the same warm-started weights."""
    import functools

    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from lit_rl.models.ar import TinyCausalLM
    from lit_rl.tasks import ChainSumTask

    bed = testbed()
    torch.set_num_threads(bed["threads"])
    policy = TinyCausalLM(**bed["policy"], init_checkpoint=str(warm))
    tok = policy.tokenizer
    task = ChainSumTask(**bed["task"])
    examples = task.train_examples()
    # prompts rendered by the tokenizer's chat template, as lit_rl renders them: the same token ids
    prompts = [tok.apply_chat_template(task.messages(e), tokenize=False, add_generation_prompt=True) for e in examples]
    dataset = Dataset.from_dict({"prompt": prompts, "example_index": list(range(len(examples)))})
    reward = functools.partial(chainsum_reward, task=task, examples=examples)
    reward.__name__ = "chainsum_reward"
    changed = trl_changed_settings(steps, seed, str(out_dir / "trl_run"))
    args = GRPOConfig(**{c["setting"]: c["value"] for c in changed})
    trainer = GRPOTrainer(model=policy.model, reward_funcs=reward, args=args, train_dataset=dataset,
                          processing_class=tok)
    clock = StepClock()
    trainer._generate_single_turn = clock.timed(trainer._generate_single_turn, "gen",
                                                lambda out: sum(len(c) for c in out[0]))
    trainer._calculate_rewards = clock.timed(trainer._calculate_rewards, "score")
    # profile: rollouts (gen + score + decoding + advantages, π_old only when reused), loss_forward (compute_loss)
    trainer._generate_and_score_completions = clock.timed(trainer._generate_and_score_completions, "rollouts")
    trainer.compute_loss = clock.timed(trainer.compute_loss, "loss_forward")

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            clock.start()

        def on_step_end(self, args, state, control, **kwargs):
            clock.step_end()

    trainer.add_callback(Clock())
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0
    assert trainer.state.global_step == steps, (trainer.state.global_step, steps)
    return {"steps": clock.steps, "train_s": train_s, "peak_rss_mb": _peak_rss_mb(), "model": trainer.model,
            "changed_settings": changed}


def child_main(side: str, steps: int, seed: int, warm: str, out_dir: str, eval_problems: int, eval_samples: int,
               overrides: list[str]) -> None:
    """One side, one seed: train, then evaluate; prints one JSON line."""
    import lit_rl

    assert Path(lit_rl.__file__).resolve().is_relative_to(ROOT), f"lit_rl imported from {lit_rl.__file__}"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if side == "trl":
        res = run_trl(steps, seed, Path(warm), out)
    else:
        full = ["model.init_args.loss.trim_padding=false"] if side == "lit_full" else []
        res = run_lit(steps, seed, Path(warm), out, double_rollout=side == "lit_dr", overrides=full + overrides)
    model = res.pop("model")
    res["heldout_accuracy"] = heldout_accuracy(model, eval_problems, eval_samples, seed)
    res.pop("changed_settings", None)
    print("SIDE_RESULT " + json.dumps(res), flush=True)
