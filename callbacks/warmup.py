"""Format warm-up: a short masked-denoising SFT on format-only completions before RL starts.

A randomly initialised tiny dLLM writes nothing parseable, so RL would get no signal. The warm-up teaches
the output format only — ``<reasoning>`` with random content of random length, ``<answer>`` that copies the
givens with random digits in the blanks (:func:`lit_rl.tasks.registry.format_warmup_text`) — so greedy
accuracy after it stays near chance and everything above comes from RL. Varying trace lengths keep the
completion length free to move.

The warmed-up weights are cached under ``cache_dir`` keyed by a hash of the initial weights, the training prompts
and answers, and every warm-up setting, so repeated runs skip it (except under FSDP2 sharding:
:func:`_weights_digest`). It runs only on a fresh fit (never when resuming from a checkpoint) and only changes the
policy before the first rollout.
"""

from __future__ import annotations

import hashlib
import random
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info

from lit_rl.core.denoising import denoising_masks, masked_denoising_loss
from lit_rl.checkpoint_io import atomic_torch_save
from lit_rl.errors import FieldError
from lit_rl.rng import cpu_generator
from lit_rl.tasks.registry import format_warmup_text


def _weights_digest(module: torch.nn.Module) -> str | None:
    """Hash of ``module``'s state dict; ``None`` for FSDP2-sharded weights (DTensors), which are not cached:
    a saved state dict of DTensors holds the saving rank's shards only, and other ranks would load those."""
    from torch.distributed.tensor import DTensor

    if any(isinstance(t, DTensor) for t in module.state_dict().values()):
        return None
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


class FormatWarmup(L.Callback):
    """Masked-denoising SFT on format-only completions at fit start (tiny models).

    Args:
        steps: SFT optimizer steps.
        lr: AdamW learning rate of the warm-up.
        batch_size: completions per step.
        seed: seed of the texts and masks.
        trace: format style of :func:`~lit_rl.tasks.registry.format_warmup_text` (``None``: the task's
            default; Sudoku ``grid`` is the fixed-length format of the ``grid`` external pool).
        cache_dir: where warmed-up weights are cached (``None`` disables the cache; FSDP2-sharded policies
            are never cached).
    """

    @staticmethod
    def check_args(steps: int = 300, batch_size: int = 32) -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`);
        :class:`~callbacks.ar_warmup.ScriptedSFTWarmup` shares them."""
        if steps < 0:
            raise FieldError("steps", f"must be >= 0, got {steps}")
        if batch_size < 1:
            raise FieldError("batch_size", f"must be >= 1, got {batch_size}")

    def __init__(
        self, steps: int = 300, lr: float = 1e-3, batch_size: int = 32, seed: int = 0,
        cache_dir: str | None = "runs/cache", trace: str | None = None,
    ) -> None:
        FormatWarmup.check_args(steps=steps, batch_size=batch_size)
        self.steps, self.lr, self.batch_size, self.seed, self.cache_dir = steps, lr, batch_size, seed, cache_dir
        self.trace = trace
        self.ran = False

    def cache_path(self, policy: torch.nn.Module, dm) -> Path | None:
        """Where the warmed-up weights of ``policy`` on ``dm``'s task are cached (``None``: not cached). The key
        covers the starting weights, every warm-up setting and the training data (prompts and answers, which
        the warm-up texts are drawn from): a task with other ranges, templates or problems under the same name
        never loads another task's warmed-up weights. And the thread count: training with another one rounds
        differently (a 1-thread sweep trial's warm-up is not a 2-thread run's, bit for bit)."""
        digest = _weights_digest(policy)
        if not (self.cache_dir and digest):
            return None
        data = hashlib.sha256("\n".join(f"{e.question}|{e.answer!r}" for e in dm.train_examples).encode())
        key = hashlib.sha256(
            f"{digest}|{dm.task.name}|{dm.generation.gen_length}|{self.steps}|{self.lr}|{self.batch_size}|{self.seed}"
            f"{'|' + self.trace if self.trace else ''}|{dm.max_prompt_len}|{data.hexdigest()[:16]}"
            f"|threads={torch.get_num_threads()}".encode()  # another thread count rounds differently
        ).hexdigest()[:16]
        return Path(self.cache_dir) / f"format_warmup_{dm.task.name}_{key}.pt"

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.ckpt_path or trainer.global_step > 0 or self.steps == 0:
            return
        dm = trainer.datamodule
        policy = pl_module.policy
        dm.setup("fit")
        cache = self.cache_path(policy, dm)
        if cache is not None and cache.exists():
            policy.load_state_dict(torch.load(cache, map_location=pl_module.device, weights_only=True))
            rank_zero_info(f"format warm-up: loaded cached weights {cache}")
            self.ran = True
            return
        t0 = time.perf_counter()
        loss = self._train(policy, dm, pl_module.device)
        rank_zero_info(f"format warm-up: {self.steps} steps in {time.perf_counter() - t0:.1f}s, final loss {loss:.3f}")
        if cache is not None and trainer.is_global_zero:
            atomic_torch_save(policy.state_dict(), cache)
        self.ran = True

    def _train(self, policy: torch.nn.Module, dm, device: torch.device) -> float:
        rng = random.Random(self.seed)
        gen = cpu_generator(self.seed)
        examples = dm.train_examples
        params = [p for p in policy.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=self.lr, weight_decay=0.0)
        width = dm.generation.gen_length
        policy.train()
        loss_val = float("nan")
        for step in range(self.steps):
            batch = [examples[rng.randrange(len(examples))] for _ in range(self.batch_size)]
            texts = [format_warmup_text(dm.task.name, e, rng, self.trace) for e in batch]
            prompt_ids, prompt_mask = policy.encode_prompts([dm.task.messages(e) for e in batch], dm.max_prompt_len)
            comp, lengths = policy.encode_completions(texts, width)  # (B, L), (B,)
            # the whole width is trained, EOS padding included (as LLaDA's SFT), so the model learns to stop
            comp_mask = torch.ones_like(comp, dtype=torch.bool)
            lengths = torch.full_like(lengths, width)
            t, masked = denoising_masks(comp_mask, gen)
            P = prompt_ids.shape[1]
            noisy = torch.where(masked, torch.full_like(comp, policy.mask_id), comp)
            ids = torch.cat([prompt_ids, noisy], 1).to(device)  # (B, P+L)
            attn = torch.cat([prompt_mask, torch.ones_like(comp)], 1).to(device)
            logits = policy(ids, attn)[:, P:]  # (B, L, V)
            loss = masked_denoising_loss(logits, comp.to(device), masked.to(device), t.to(device), lengths.to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            loss_val = loss.item()
            if (step + 1) % 100 == 0:
                rank_zero_info(f"format warm-up step {step + 1}/{self.steps}: loss {loss_val:.3f}")
        return loss_val
