"""AR warm start: a short SFT of a tiny causal LM on scripted traces at fit start, cached on disk.

A randomly initialised tiny causal LM writes nothing parseable, so GRPO gets no signal. This callback runs
:func:`lit_rl.algorithms.ar_sft.scripted_sft` on the scripted solver's completions for the task
(:mod:`lit_rl.tasks.registry`: Countdown search traces, Sudoku deduction traces), so
the policy RL starts from writes ``<reasoning>...</reasoning>\\n<answer>...</answer>`` and solves part of
the problems. ``error_rate`` makes the teacher wrong on purpose on that share of the traces (one operator
of the answer changed), so the warmed-up policy also makes that mistake sometimes and RL has something to
fix besides the arithmetic.

This is the documented command that produces the embedded default's starting policy: it runs on the fly
inside ``python -m lit_rl fit --config conf/double_rollout.yaml`` (and its ``conf/grpo.yaml`` overlay), and the
warmed-up weights are cached under ``cache_dir`` keyed by a hash of the initial weights, the task and
every warm-up setting, so every later run (and the GRPO baseline, which has the same policy and warm-up)
starts from the same weights without redoing it. To keep a copy, the cache file is a plain
``torch.save``'d state dict that ``TinyCausalLM(init_checkpoint=...)`` loads. It runs only on a fresh fit
(never when resuming) and changes the policy before data profiling and the first rollout.
"""

from __future__ import annotations

import functools
import hashlib
import random
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info

from callbacks.warmup import FormatWarmup, _weights_digest
from lit_rl.algorithms.ar_sft import scripted_sft
from lit_rl.checkpoint_io import atomic_torch_save
from lit_rl.errors import FieldError
from lit_rl.tasks.registry import known_traces

__all__ = ["ScriptedSFTWarmup"]


class ScriptedSFTWarmup(L.Callback):
    """Completion-only SFT on scripted traces at fit start (tiny AR models).

    Args:
        steps: SFT optimizer steps.
        lr: AdamW learning rate (linearly decayed to 10%).
        batch_size: completions per step.
        error_rate: share of teacher traces whose answer is made wrong on purpose.
        max_completion_len: target completions are cut to this many tokens (EOS included).
        seed: seed of the prompt draws and traces.
        trace: trace style of the task's registry entry (:mod:`lit_rl.tasks.registry`) (``None``: the task's first,
            e.g. Sudoku ``deduction``; ``grid`` is the fixed-length trace a tiny causal LM learns quickly).
        cache_dir: where warmed-up weights are cached (``None`` disables the cache).
    """

    @staticmethod
    def check_args(steps: int = 300, batch_size: int = 32, error_rate: float = 0.0) -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`):
        :class:`~callbacks.warmup.FormatWarmup`'s, and the error rate."""
        FormatWarmup.check_args(steps=steps, batch_size=batch_size)
        if not 0 <= error_rate <= 1:
            raise FieldError("error_rate", f"must be in [0, 1], got {error_rate}")

    def __init__(
        self,
        steps: int = 300,
        lr: float = 2e-3,
        batch_size: int = 32,
        error_rate: float = 0.0,
        max_completion_len: int = 128,
        seed: int = 0,
        cache_dir: str | None = "runs/cache",
        trace: str | None = None,
    ) -> None:
        ScriptedSFTWarmup.check_args(steps=steps, batch_size=batch_size, error_rate=error_rate)
        self.steps, self.lr, self.batch_size = steps, lr, batch_size
        self.error_rate, self.max_completion_len, self.seed, self.cache_dir = (
            error_rate, max_completion_len, seed, cache_dir)
        self.trace = trace
        self.ran = False
        self.final_loss: float | None = None

    def cache_path(self, policy: torch.nn.Module, dm) -> Path | None:
        if not self.cache_dir:
            return None
        text = (
            f"{_weights_digest(policy)}|{dm.task.name}|{dm.max_prompt_len}|{self.steps}|{self.lr}|{self.batch_size}|"
            f"{self.error_rate}|{self.max_completion_len}|{self.seed}|{len(self._examples(dm))}|"
            # the problems themselves: a task whose training set changes must not reuse a stale warm start
            f"{hashlib.sha256(chr(10).join(e.question for e in self._examples(dm)).encode()).hexdigest()[:16]}"
        )
        text += f"|{self.trace}" if self.trace is not None else ""
        text += f"|threads={torch.get_num_threads()}"  # another thread count rounds differently
        # the teacher itself (its code and constants, e.g. chainsum.GUESS_RATE): what it writes for a few problems
        rng = random.Random(f"lit_rl/warmup-teacher/{self.seed}")
        make = self.teacher(dm.task.name)
        text += "|" + hashlib.sha256("\n".join(_teacher(make, self.error_rate, e, rng)
                                               for e in self._examples(dm)[:16]).encode()).hexdigest()[:16]
        key = hashlib.sha256(text.encode()).hexdigest()[:16]
        return Path(self.cache_dir) / f"ar_sft_{dm.task.name}_{key}.pt"

    @staticmethod
    def _examples(dm) -> list:
        """Every training prompt of the task: the warm-up is not limited by ``data.num_train_prompts`` or
        data profiling, which choose the RL prompt set."""
        return list(dm.task.train_examples())

    def teacher(self, task_name: str):
        """The scripted trace function for ``task_name`` and :attr:`trace` (clear error if unknown)."""
        from lit_rl.tasks.registry import scripted_tasks

        styles = known_traces(task_name)
        if not styles:
            raise ValueError(f"ScriptedSFTWarmup: no scripted traces for task {task_name!r} "
                             f"(known: {sorted(scripted_tasks())})")
        if self.trace is None:
            return next(iter(styles.values()))
        if self.trace not in styles:
            raise ValueError(f"ScriptedSFTWarmup.trace: {self.trace!r} is not a {task_name} trace style "
                             f"(known: {sorted(styles)})")
        return styles[self.trace]

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.ckpt_path or trainer.global_step > 0 or self.steps == 0:
            return
        dm = trainer.datamodule
        dm.setup("fit")
        policy = pl_module.policy
        name = dm.task.name
        make = self.teacher(name)
        cache = self.cache_path(policy, dm)
        if cache is not None and cache.exists():
            policy.model.load_state_dict(torch.load(cache, map_location=pl_module.device, weights_only=True))
            rank_zero_info(f"AR SFT warm-up: loaded cached weights {cache}")
            self.ran = True
            return
        t0 = time.perf_counter()
        make_text = functools.partial(_teacher, make, self.error_rate)
        self.final_loss = scripted_sft(
            policy, dm.task, self._examples(dm), make_text, self.steps, lr=self.lr, batch_size=self.batch_size,
            max_prompt_len=dm.max_prompt_len, max_completion_len=self.max_completion_len, seed=self.seed,
            device=pl_module.device, log=rank_zero_info,
        )
        rank_zero_info(f"AR SFT warm-up: {self.steps} steps in {time.perf_counter() - t0:.1f}s, "
                       f"final loss {self.final_loss:.3f}")
        if cache is not None and trainer.is_global_zero:
            atomic_torch_save(policy.model.state_dict(), cache)  # HF names: loadable as init_checkpoint
            rank_zero_info(f"AR SFT warm-up: saved the warm start to {cache}")
        self.ran = True


def _teacher(fn, error_rate: float, example, rng) -> str:
    return fn(example, rng, error_rate=error_rate)
