"""The AR rollout DataModule: a seeded prompt stream whose batches become G rollouts per prompt at batch
start (first stage of GRPO / double-rollout GRPO), plus data profiling.

1. **Prompt stream** (:class:`datamodules.stream.PromptStreamDataModule`): seeded order, per-rank
   batches, ``prompt_order.jsonl``, cursor in every checkpoint.
2. **First-stage rollouts** at the start of each training batch (``on_after_batch_transfer``):
   ``num_generations`` (G) completions per prompt from the *current* policy through the run's engine
   (:meth:`ARRolloutDataModule.engine`; ``backend``: HF with shared prefill by default, or vLLM), which first
   syncs the policy's weights when an optimizer step has changed them, seeded by ``(seed, step)``; each
   completion is scored
   with the task's training reward (``Task.total_reward``). The module's dependent stages run next,
   here, with the same engine (:meth:`~datamodules.stream.PromptStreamDataModule.run_stages`: double
   rollout's continuations, :mod:`lit_rl.algorithms.dr_stage`); the module's processors only read their
   typed output (``PromptBatch.continuations``).
3. **Data profiling** (DR §3: "data profiling is done for all experiments to remove prompts with zero or
   100% pass rates"): before the first training batch, ``profiling.num_samples`` completions per training
   prompt are drawn from the *initial* policy (after any warm-up) and prompts whose pass rate is 0 or 1 are
   dropped (:func:`~lit_rl.core.double_rollout.pass_rate_filter`). The pass rates are cached in
   a JSON file keyed by the policy (a digest of its weights, or its checkpoint path for pretrained
   models), the task, the prompt set and the profiling settings, so repeated runs skip it; the kept ids
   are saved in checkpoints, so a resumed run (whose policy is no longer the initial one) keeps the same
   prompts.
4. **Validation batches** are decoded with ``eval_generation`` (greedy by default) and scored with the
   task's evaluation rule.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info

from datamodules.sources import AROnPolicy
from datamodules.stream import PromptStreamDataModule, step_seed
from lit_rl.core.double_rollout import pass_rate_filter
from lit_rl.atomic import atomic_write_text
from lit_rl.errors import FieldError
from lit_rl.generation.ar import ARBackend, HFBackend
from lit_rl.models.ar import SamplingSettings
from lit_rl.batch import PromptBatch, RolloutBatch, Source
from lit_rl.tasks.base import Example, Task

__all__ = ["ARRolloutDataModule", "ProfilingSettings", "policy_key", "profile_pass_rates"]

BackendFactory = Callable[[torch.nn.Module], ARBackend]


@dataclass
class ProfilingSettings:
    """Data profiling: drop training prompts the initial policy always or never solves.

    Attributes:
        num_samples: completions per prompt (sampled with the training generation settings).
        max_prompts: profile only the first N training prompts and train on the kept ones among them
            (``null``: all).
        batch_prompts: prompts per generation call.
        correct_threshold: reward at or above which a completion passes (``null``: the task's
            ``correct_reward``, MATH 2.0, others 1.0).
        low, high: keep prompts with ``low < pass rate < high``.
        cache_dir: where pass rates are cached (``null``: no cache).
        seed: sampling seed.
    """

    num_samples: int = 8
    max_prompts: int | None = None
    batch_prompts: int = 64
    correct_threshold: float | None = None
    low: float = 0.0
    high: float = 1.0
    cache_dir: str | None = "runs/cache"
    seed: int = 1234

    def __post_init__(self) -> None:
        if self.num_samples < 1 or self.batch_prompts < 1:
            raise ValueError(f"data.profiling: num_samples and batch_prompts must be >= 1, got {self}")
        if not 0 <= self.low < self.high <= 1:
            raise ValueError(f"data.profiling: need 0 <= low < high <= 1, got {self.low}, {self.high}")


def policy_key(policy: torch.nn.Module) -> str:
    """Identity of a policy for caches: its checkpoint path when it has one (pretrained models; hashing
    tens of GB of weights would take minutes), else a digest of its weights."""
    path = getattr(policy, "path", None)
    if path:
        return f"path:{path}"
    h = hashlib.sha256()
    for name, t in sorted(policy.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().float().numpy().tobytes())
    return "weights:" + h.hexdigest()[:16]


def profile_pass_rates(
    policy: torch.nn.Module,
    backend: ARBackend,
    task: Task,
    examples: list[Example],
    generation: SamplingSettings,
    settings: ProfilingSettings,
    max_prompt_len: int | None,
    threshold: float,
) -> list[float]:
    """Pass rate of each example under ``policy``: share of ``num_samples`` completions with reward >=
    ``threshold``."""
    device = next(policy.parameters()).device
    n = settings.num_samples
    rates: list[float] = []
    for s in range(0, len(examples), settings.batch_prompts):
        chunk = examples[s : s + settings.batch_prompts]
        ids, mask = policy.encode_prompts([task.messages(e) for e in chunk], max_prompt_len)  # (b, P)
        comp = backend.generate(
            ids.to(device), mask.to(device), max_new_tokens=generation.max_new_tokens,
            temperature=generation.temperature, top_p=generation.top_p, n=n, seed=settings.seed + s,
        )  # (b*n, L)
        texts = policy.decode_completions(comp)
        for g, ex in enumerate(chunk):
            rates.append(sum(task.total_reward(t, ex) >= threshold for t in texts[g * n : (g + 1) * n]) / n)
    return rates


class ARRolloutDataModule(PromptStreamDataModule):
    """Prompt groups whose G first-stage rollouts are generated per batch, for AR policies.

    Args:
        task: the task (prompts, verifier, eval metric).
        prompts_per_batch: prompt groups per device per rollout batch (paper 128).
        num_generations: G, rollouts per prompt (paper 16; GRPO with a large rollout: G·N = 128).
        generation: first-stage sampling (``max_new_tokens``, ``temperature``, ``top_p``).
        eval_generation: decoding of the periodic evaluation (default: greedy, same length).
        profiling: data profiling settings (``null``: train on every prompt).
        max_prompt_len: prompts are cut to their last ``max_prompt_len`` tokens.
        eval_size: evaluate on the first ``eval_size`` prompts of the task's eval set (``null``: all).
        eval_batch_size: prompts per validation batch.
        seed: seed of the prompt order and of rollout sampling.
        num_train_prompts: use only the first N training prompts (before profiling and shuffling).
        output_dir: where ``prompt_order.jsonl`` and ``profile.json`` go (default: the trainer's log dir).
        backend: the generator, or a factory called with the policy (YAML: ``class_path`` of
            ``lit_rl.generation.ar.HFBackend`` / ``VLLMBackend`` with their other init args); ``null``:
            ``HFBackend(policy)``. Built when the first rollouts are due.
        sources: the training rows' sources (:mod:`datamodules.sources`) instead of ``num_generations``
            first-stage rollouts (``AROnPolicy``).
    """

    @staticmethod
    def check_args(num_generations: int = 8) -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`); the
        prompt stream's are :meth:`PromptStreamDataModule.check_args`."""
        if num_generations < 1:
            raise FieldError("num_generations", f"must be >= 1, got {num_generations}")

    def __init__(
        self,
        task: Task,
        prompts_per_batch: int = 8,
        num_generations: int = 8,
        generation: SamplingSettings | None = None,
        eval_generation: SamplingSettings | None = None,
        profiling: ProfilingSettings | None = None,
        max_prompt_len: int | None = 1024,
        eval_size: int | None = 128,
        eval_batch_size: int = 32,
        seed: int = 42,
        num_train_prompts: int | None = None,
        output_dir: str | None = None,
        backend: ARBackend | BackendFactory | None = None,
        sources: Sequence[Any] | None = None,
    ) -> None:
        super().__init__(
            task, prompts_per_batch=prompts_per_batch, max_prompt_len=max_prompt_len, eval_size=eval_size,
            eval_batch_size=eval_batch_size, seed=seed, num_train_prompts=num_train_prompts, output_dir=output_dir,
        )
        ARRolloutDataModule.check_args(num_generations=num_generations)
        self.num_generations = num_generations
        if generation is None and sources is not None:  # the list's first-stage sampling is the run's
            generation = next((s.generation for s in sources if isinstance(s, AROnPolicy)), None)
        self.generation = generation or SamplingSettings()
        self.eval_generation = eval_generation or SamplingSettings(
            max_new_tokens=self.generation.max_new_tokens, temperature=0.0
        )
        self.profiling = profiling
        self.kept_ids: list[str] | None = None  # after profiling (checkpointed)
        self._all_train: list[Example] | None = None
        self.profile_stats: dict[str, float] = {}
        self.sources = list(sources) if sources is not None else [AROnPolicy(num_generations, self.generation)]
        self.backend_spec = backend
        self._generator: ARBackend | None = backend if isinstance(backend, ARBackend) else None
        self._synced_step: int | None = None

    # -- the engine ----------------------------------------------------------------------------------
    def engine(self, policy: torch.nn.Module | None = None) -> ARBackend:
        """The generation backend (the run's :class:`~lit_rl.generation.engine.Engine`), built for ``policy``
        (default: the connected one) on first use, with the policy's current weights: pushed when the connected
        weight version (the module's optimizer step count) changed since the last push, or on every call when
        none is connected; a no-op for HF, which shares the policy's modules."""
        policy = policy if policy is not None else self._connected()
        if self._generator is None:
            spec = self.backend_spec
            self._generator = HFBackend(policy) if spec is None else spec(policy)
        version = self._version() if self._version is not None else None
        if version is None or version != self._synced_step:
            self._generator.sync(policy)
            self._synced_step = version
        return self._generator

    # -- data ----------------------------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        super().setup(stage)
        if self._all_train is None:
            self._all_train = list(self.train_examples)
            if self.kept_ids is not None:
                self._apply_kept(self.kept_ids)

    @property
    def all_train_examples(self) -> list[Example]:
        """Training prompts before data profiling (what warm-ups draw from)."""
        assert self._all_train is not None, "call setup() first"
        return self._all_train

    def _apply_kept(self, kept: list[str]) -> None:
        keep = set(kept)
        self._set_train_examples([e for e in self.all_train_examples if e.id in keep])

    def prompt_batch(self, step: int) -> PromptBatch:
        if self.profiling is not None and self.kept_ids is None and (
                self._policy is not None or getattr(self, "trainer", None) is not None):
            policy = self._connected()
            self.profile(policy, self.engine(policy))
        return super().prompt_batch(step)

    def profile(self, policy: torch.nn.Module, backend: ARBackend) -> list[str]:
        """Data profiling (module docstring): sets and returns the kept prompt ids."""
        assert self.profiling is not None
        s = self.profiling
        examples = self.all_train_examples[: s.max_prompts] if s.max_prompts is not None else self.all_train_examples
        threshold = s.correct_threshold if s.correct_threshold is not None else float(self.task.correct_reward)
        key_src = json.dumps({
            "policy": policy_key(policy), "task": self.task.name, "ids": [e.id for e in examples],
            "questions": hashlib.sha256("".join(e.question for e in examples).encode()).hexdigest(),
            "generation": asdict(self.generation), "profiling": asdict(s) | {"cache_dir": None},
            "threshold": threshold, "max_prompt_len": self.max_prompt_len,
        }, sort_keys=True)
        key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
        cache = Path(s.cache_dir) / f"profile_{self.task.name}_{key}.json" if s.cache_dir else None
        t0 = time.perf_counter()
        if cache is not None and cache.exists():
            rates = json.loads(cache.read_text())["pass_rates"]
            rank_zero_info(f"data profiling: loaded cached pass rates {cache}")
        else:
            with torch.random.fork_rng(devices=[]):
                rates = profile_pass_rates(
                    policy, backend, self.task, examples, self.generation, s, self.max_prompt_len, threshold
                )
            if cache is not None and self._world()[0] == 0:
                atomic_write_text(cache, json.dumps({"ids": [e.id for e in examples], "pass_rates": rates}))
        keep = pass_rate_filter(torch.tensor(rates, dtype=torch.float64), s.low, s.high).tolist()
        kept = [e.id for e, k in zip(examples, keep) if k]
        self.profile_stats = {
            "data/profiled_prompts": float(len(examples)),
            "data/kept_prompts": float(len(kept)),
            "data/pass_rate_0_frac": sum(r <= s.low for r in rates) / max(len(rates), 1),
            "data/pass_rate_1_frac": sum(r >= s.high for r in rates) / max(len(rates), 1),
            "data/profiling_s": time.perf_counter() - t0,
        }
        rank_zero_info(
            f"data profiling: kept {len(kept)}/{len(examples)} prompts "
            f"({self.profile_stats['data/pass_rate_0_frac']:.0%} never solved, "
            f"{self.profile_stats['data/pass_rate_1_frac']:.0%} always solved)"
        )
        if not kept:
            raise ValueError(
                "data.profiling dropped every prompt (pass rate 0 or 1 under the initial policy); "
                "lower data.profiling.num_samples, warm the policy up, or disable profiling"
            )
        self.kept_ids = kept
        self._apply_kept(kept)
        return kept

    # -- checkpointed state ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"kept_ids": self.kept_ids}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.kept_ids = state.get("kept_ids")
        if self.kept_ids is not None and self._all_train is not None:
            self._apply_kept(self.kept_ids)

    # -- rollouts ----------------------------------------------------------------------------------
    def _encode(self, policy: torch.nn.Module, examples: list[Example]) -> tuple[torch.Tensor, torch.Tensor]:
        device = next(policy.parameters()).device
        ids, mask = self.encode_prompts(policy, examples)
        return ids.to(device), mask.to(device)  # (B_p, P)

    def extra_stats(self) -> dict[str, float]:
        return dict(self.profile_stats)

    def evaluate_batch(self, batch: PromptBatch, module: L.LightningModule) -> RolloutBatch:
        """``eval_generation`` completions of eval prompts; ``rewards`` = eval ``correct``, ``eval_total``."""
        policy = getattr(module, "policy", module)
        prompt_ids, prompt_mask = self._encode(policy, batch.examples)
        comp = self.engine(policy).sample(prompt_ids, prompt_mask, self.eval_generation,
                                          seed=step_seed(self.seed, 0, salt=1)).to(prompt_ids.device)  # (B, L)
        return self._rows(policy, batch.examples, prompt_ids, prompt_mask, comp, 1)

    def _rows(
        self,
        policy: torch.nn.Module,
        examples: list[Example],
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        comp: torch.Tensor,
        n: int,
    ) -> RolloutBatch:
        """Evaluation rows of ``n`` completions per prompt (prompt-major), scored by the task's eval rule."""
        device = prompt_ids.device
        R, L = comp.shape
        grp = torch.arange(len(examples), device=device).repeat_interleave(n)  # (R,)
        texts = policy.decode_completions(comp)
        lengths = policy.completion_lengths(comp)  # (R,)
        scores = [self.task.evaluate(t, examples[k // n]) for k, t in enumerate(texts)]
        return RolloutBatch(
            input_ids=torch.cat([prompt_ids[grp], comp], 1),  # (R, P+L)
            attention_mask=torch.cat([prompt_mask[grp], torch.ones_like(comp)], 1),
            prompt_len=prompt_ids.shape[1],
            completion_mask=torch.arange(L, device=device)[None, :] < lengths[:, None],  # (R, L)
            lengths=lengths,
            rewards=torch.tensor([s.correct for s in scores], dtype=torch.float32, device=device),
            source=torch.full((R,), int(Source.ON_POLICY), dtype=torch.long, device=device),
            group=grp,
            texts=texts,
            prompt_ids=[examples[k // n].id for k in range(R)],
            hit_limit=(comp != policy.eos_id).all(-1),
            eval_total=torch.tensor([s.total for s in scores], dtype=torch.float32, device=device),
        )
