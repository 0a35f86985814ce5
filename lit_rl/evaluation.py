"""Checkpoint evaluation protocol (docs/tasks.md; ERILS §V-A, App. C-E): the pure pieces.

The :class:`callbacks.passk.PassAtKEvaluation` callback is a thin scheduler around these functions:

* :class:`EvalConfig` — one named configuration: decoding settings, number of samples and their seeds
  (the paper: ``multi`` = T 0.9, L_gen 256, 4 samples with seeds 1001..1004; ``det128/256/512`` = T 0,
  steps L_gen/2, block 32, one sample). :func:`paper_configs` builds that list.
* :func:`eval_batches` — the fixed eval prompts cut into generation batches, and which of them a rank
  evaluates (whole batches round-robin, so a batch holds the same prompts on 1 or 8 devices and the
  seeded decoder draws the same noise for it: the pooled numbers do not depend on the world size).
* :func:`run_config` — generate ``n`` completions per prompt (one decoder call per seed and batch, the
  policy's own training decoder) and score them with the task's **evaluation** parser (lenient, §5) or
  its reward parser (``parser="reward"``). Works with any policy that has ``encode_prompts``,
  ``decode_completions`` and ``generate(prompt_ids, prompt_mask, settings, seed)`` (dLLM or AR); the
  settings object is passed through untouched.
* :class:`ConfigScorer` — the torchmetrics of one configuration (DDP-synced sums):
  ``pass@k`` for k = 1..n by the first-k protocol (Sudoku: best-of-k cell accuracy pooled over blank
  cells, because every prompt is weighted by its number of evaluation units), ``accuracy`` (pooled over
  all n samples; equals ``pass@1`` for a single-sample configuration), optionally the unbiased
  ``unbiased_pass@k`` (Chen et al. 2021; a sample counts as correct only if it is fully correct), and
  the completion ``length_mean`` / ``hit_limit_frac`` (share of completions with no EOS in L_gen).
* :class:`ResultsTable` — results across checkpoints (step × config × metric) with CSV/Markdown output
  and the App. D report: the best checkpoint per configuration and the final checkpoint.

Determinism: prompts, batches and seeds are fixed, and ``generate`` seeds its own generator, so two
evaluations of the same weights give identical numbers on CPU (a test checks it).
"""

from __future__ import annotations

import csv
import io
import json
import math
import random
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, Sequence

import torch
from torchmetrics.aggregation import MeanMetric

from lit_rl.errors import FieldError
from lit_rl.generation.settings import DecodeSettings
from lit_rl.metrics import FirstKPassAtK, MeanAccuracy, UnbiasedPassAtK
from lit_rl.tasks.base import PARSERS, Example, Task

__all__ = [
    "ConfigResult",
    "ConfigScorer",
    "EvalConfig",
    "ResultsTable",
    "eval_batches",
    "is_due",
    "metric_key",
    "paper_configs",
    "run_config",
    "select_subset",
    "settings_summary",
]

#: first seed of the paper's multi-sample evaluation (seeds 1001..1004)
FIRST_SEED = 1001


def _build_settings(value: Any) -> Any:
    """``None`` → default :class:`DecodeSettings`; a plain dict → ``DecodeSettings(**dict)``; a dict with
    ``class_path`` (e.g. an AR policy's sampling settings) → that class built with its ``init_args``;
    anything else is returned as is (passed through to ``policy.generate``)."""
    if value is None:
        return DecodeSettings()
    if isinstance(value, dict):
        if "class_path" in value:
            import importlib

            module, _, name = value["class_path"].rpartition(".")
            return getattr(importlib.import_module(module), name)(**(value.get("init_args") or {}))
        return DecodeSettings(**value)
    return value


@dataclass
class EvalConfig:
    """One named evaluation configuration.

    Attributes:
        name: short name used in metric keys, ``val/<task>/<name>/pass@k`` (e.g. ``multi``, ``det256``).
        generation: decoding settings handed to ``policy.generate`` unchanged (dLLM: ``DecodeSettings``
            or a dict of its fields; an AR policy's own settings object via ``class_path``).
        num_samples: completions per prompt, n; Pass@k is reported for k = 1..n.
        seeds: one seed per sample, in order (Pass@k uses the first k); default ``1001 .. 1000 + n``.
        parser: ``"eval"`` (reference evaluation parsing, lenient; the papers' tables) or ``"reward"``.
        unbiased: also report the unbiased estimator ``unbiased_pass@k`` (binary: fully correct samples).
    """

    name: str
    generation: Any = None
    num_samples: int = 1
    seeds: list[int] | None = None
    parser: str = "eval"
    unbiased: bool = False

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError(f"eval config name must be non-empty without '/', got {self.name!r}")
        if self.num_samples < 1:
            raise ValueError(f"eval config {self.name!r}: num_samples must be >= 1, got {self.num_samples}")
        if self.seeds is None:
            self.seeds = [FIRST_SEED + i for i in range(self.num_samples)]
        self.seeds = [int(s) for s in self.seeds]
        if len(self.seeds) != self.num_samples:
            raise ValueError(
                f"eval config {self.name!r}: seeds has {len(self.seeds)} entries but num_samples is {self.num_samples}"
            )
        if self.parser not in PARSERS:
            raise ValueError(f"eval config {self.name!r}: parser must be one of {PARSERS}, got {self.parser!r}")
        try:
            self.generation = _build_settings(self.generation)
        except FieldError as e:  # the field's place in this config: generation.<field>
            raise FieldError(f"generation.{e.field}", e.problem) from None

    @property
    def metric_names(self) -> list[str]:
        """The metrics this configuration reports, in table order."""
        names = [f"pass@{k}" for k in range(1, self.num_samples + 1)] + ["accuracy"]
        if self.unbiased:
            names += [f"unbiased_pass@{k}" for k in range(1, self.num_samples + 1)]
        return names + ["length_mean", "hit_limit_frac"]


def paper_configs(
    multi_gen_length: int = 256,
    det_gen_lengths: Sequence[int] = (128, 256, 512),
    block_length: int = 32,
    multi_temperature: float = 0.9,
    num_samples: int = 4,
    first_seed: int = FIRST_SEED,
) -> list[EvalConfig]:
    """ERILS §V-A: ``multi`` (T 0.9, n samples, seeds first_seed.., L_gen 256) and ``det<L>`` (T 0, one
    sample) for each deterministic L_gen; steps = L_gen/2, block 32 throughout."""
    multi = EvalConfig(
        name="multi",
        generation=DecodeSettings(multi_gen_length, block_length, multi_gen_length // 2, multi_temperature),
        num_samples=num_samples,
        seeds=[first_seed + i for i in range(num_samples)],
    )
    det = [
        EvalConfig(name=f"det{L}", generation=DecodeSettings(L, block_length, L // 2, 0.0), num_samples=1,
                   seeds=[first_seed])
        for L in det_gen_lengths
    ]
    return [multi, *det]


def settings_summary(settings: Any) -> dict[str, Any]:
    """A JSON-able description of a settings object (dataclass fields or public attributes)."""
    if is_dataclass(settings) and not isinstance(settings, type):
        return {"type": type(settings).__name__, **asdict(settings)}
    if isinstance(settings, dict):
        return dict(settings)
    attrs = {k: v for k, v in vars(settings).items() if not k.startswith("_")} if hasattr(settings, "__dict__") else {}
    return {"type": type(settings).__name__,
            **{k: v for k, v in attrs.items() if isinstance(v, (int, float, str, bool, type(None)))}}


def metric_key(prefix: str, task: str, config: str, metric: str) -> str:
    """``<prefix>/<task>/<config>/<metric>``, e.g. ``val/sudoku/det256/pass@1``."""
    return f"{prefix}/{task}/{config}/{metric}"


# -- schedule and prompts ----------------------------------------------------------------------------


def is_due(global_step: int, last_step: int, start: int, every: int) -> bool:
    """Whether an evaluation is due at ``global_step``: some scheduled step ``s`` in
    ``{start, start + every, ...}`` with ``s >= 1`` lies in ``(last_step, global_step]``.

    Training makes μ optimizer updates per rollout batch, so ``global_step`` may jump over a scheduled
    step; the evaluation then runs at the first batch end past it (and records the actual step).
    Step 0 (the starting policy) is never due here: that is the callback's ``eval_at_start``.

    >>> [s for s in range(0, 40, 12) if is_due(s, s - 12, start=0, every=25)]
    [36]
    """
    if every < 1:
        raise ValueError(f"every_n_steps must be >= 1, got {every}")
    if global_step < max(start, 1):
        return False
    latest = start + ((global_step - start) // every) * every  # largest scheduled step <= global_step
    if latest < 1:
        return False
    return latest > last_step


def select_subset(examples: Sequence[Example], size: int | None, mode: str = "first", seed: int = 0) -> list[Example]:
    """A fixed evaluation subset: the first ``size`` examples, or a seeded sample of ``size`` (kept in
    the eval set's order). ``size=None`` (or >= the set) keeps all."""
    examples = list(examples)
    if size is None or size >= len(examples):
        return examples
    if size < 1:
        raise ValueError(f"subset_size must be >= 1 or null, got {size}")
    if mode == "first":
        return examples[:size]
    if mode == "random":
        idx = sorted(random.Random(seed).sample(range(len(examples)), size))
        return [examples[i] for i in idx]
    raise ValueError(f"subset_mode must be 'first' or 'random', got {mode!r}")


def eval_batches(examples: Sequence[Example], batch_size: int, rank: int = 0,
                 world_size: int = 1) -> list[list[Example]]:
    """The batches rank ``rank`` of ``world_size`` evaluates: batches ``rank, rank + W, ...`` of the fixed
    cut of ``examples`` into ``batch_size`` chunks."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    batches = [list(examples[i:i + batch_size]) for i in range(0, len(examples), batch_size)]
    return batches[rank::world_size]


# -- generation and scoring --------------------------------------------------------------------------


@dataclass
class ConfigResult:
    """Scored completions of one configuration on (this rank's share of) the eval prompts.

    Attributes:
        prompt_ids: ``P`` example ids.
        correct: ``(P, n)`` evaluation units correct per sample (Sudoku: blank cells right).
        total: ``(P,)`` evaluation units per prompt (Sudoku: blank cells; otherwise 1).
        lengths: ``(P, n)`` completion tokens up to and including the first EOS.
        hit_limit: ``(P, n)`` bool, no EOS in the whole generation budget.
        texts: ``P`` lists of ``n`` decoded completions.
    """

    prompt_ids: list[str]
    correct: torch.Tensor
    total: torch.Tensor
    lengths: torch.Tensor
    hit_limit: torch.Tensor
    texts: list[list[str]] = field(default_factory=list)

    @property
    def scores(self) -> torch.Tensor:
        """``(P, n)`` fraction of units correct per sample, in [0, 1]."""
        return self.correct / self.total.clamp(min=1e-12).unsqueeze(1)


def _policy_device(policy: torch.nn.Module) -> torch.device:
    try:
        return next(policy.parameters()).device
    except StopIteration:
        return torch.device("cpu")


@torch.no_grad()
def run_config(
    policy: Any,
    task: Task,
    batches: Sequence[Sequence[Example]],
    config: EvalConfig,
    max_prompt_len: int | None = None,
) -> ConfigResult:
    """Generate ``config.num_samples`` completions per prompt (one ``generate`` call per batch and seed)
    and score each with ``task.evaluate(..., parser=config.parser)``."""
    device = _policy_device(policy) if isinstance(policy, torch.nn.Module) else torch.device("cpu")
    eos_id = getattr(policy, "eos_id", None)
    n = config.num_samples
    pids: list[str] = []
    correct_rows: list[list[float]] = []
    totals: list[float] = []
    len_rows: list[torch.Tensor] = []
    hit_rows: list[torch.Tensor] = []
    text_rows: list[list[str]] = []
    for batch in batches:
        ids, mask = policy.encode_prompts([task.messages(e) for e in batch], max_prompt_len)
        ids, mask = ids.to(device), mask.to(device)  # (B, P)
        per_seed_texts: list[list[str]] = []
        per_seed_len, per_seed_hit = [], []
        for seed in config.seeds:
            comp = policy.generate(ids, mask, config.generation, seed)  # (B, L_gen)
            per_seed_texts.append(policy.decode_completions(comp))
            per_seed_len.append(policy.completion_lengths(comp).cpu())  # (B,)
            hit = (comp != eos_id).all(-1) if eos_id is not None else torch.zeros(comp.shape[0], dtype=torch.bool)
            per_seed_hit.append(hit.cpu())  # (B,)
        for b, ex in enumerate(batch):
            texts = [per_seed_texts[s][b] for s in range(n)]
            scores = [task.evaluate(t, ex, parser=config.parser) for t in texts]
            pids.append(ex.id)
            correct_rows.append([float(s.correct) for s in scores])
            totals.append(float(scores[0].total))
            text_rows.append(texts)
        len_rows.append(torch.stack(per_seed_len, dim=1))  # (B, n)
        hit_rows.append(torch.stack(per_seed_hit, dim=1))  # (B, n)
    P = len(pids)
    return ConfigResult(
        prompt_ids=pids,
        correct=torch.tensor(correct_rows, dtype=torch.float64).reshape(P, n),
        total=torch.tensor(totals, dtype=torch.float64).reshape(P),
        lengths=torch.cat(len_rows).reshape(P, n) if len_rows else torch.zeros(0, n, dtype=torch.long),
        hit_limit=torch.cat(hit_rows).reshape(P, n) if hit_rows else torch.zeros(0, n, dtype=torch.bool),
        texts=text_rows,
    )


class ConfigScorer(torch.nn.Module):
    """The torchmetrics of one configuration; ``compute()`` syncs their sums over DDP ranks.

    Prompts are weighted by their evaluation units (``total``): Sudoku's Pass@k is best-of-k cell
    accuracy pooled over blank cells; for one-unit tasks it is the per-prompt Pass@k.
    """

    def __init__(self, config: EvalConfig) -> None:
        super().__init__()
        self.config = config
        n = config.num_samples
        self.pass_at_k = FirstKPassAtK(k_max=n)
        self.accuracy = MeanAccuracy()
        self.unbiased = UnbiasedPassAtK(ks=range(1, n + 1)) if config.unbiased else None
        self.length = MeanMetric()
        self.hit_limit = MeanMetric()

    def update(self, result: ConfigResult) -> None:
        if not result.prompt_ids:
            return
        dev = self.accuracy.correct.device
        scores = result.scores.to(dev)  # (P, n)
        total = result.total.to(dev)  # (P,)
        self.pass_at_k.update(scores, total)
        correct = result.correct.to(dev)  # (P, n)
        totals = total.unsqueeze(1).expand_as(correct)  # (P, n)
        self.accuracy.update(correct.reshape(-1), totals.reshape(-1))
        if self.unbiased is not None:
            self.unbiased.update((correct >= totals) & (totals > 0))  # fully correct samples
        self.length.update(result.lengths.to(dev, torch.float64).reshape(-1))
        self.hit_limit.update(result.hit_limit.to(dev, torch.float64).reshape(-1))

    def compute(self) -> dict[str, float]:
        out = {f"pass@{k}": float(v) for k, v in self.pass_at_k.compute().items()}
        out["accuracy"] = float(self.accuracy.compute())
        if self.unbiased is not None:
            out.update({f"unbiased_pass@{k}": float(v) for k, v in self.unbiased.compute().items()})
        out["length_mean"] = _nan_to_zero(self.length.compute())
        out["hit_limit_frac"] = _nan_to_zero(self.hit_limit.compute())
        return out


def _nan_to_zero(value: torch.Tensor) -> float:
    v = float(value)
    return 0.0 if math.isnan(v) else v


# -- results across checkpoints ----------------------------------------------------------------------


class ResultsTable:
    """Evaluation results across checkpoints: rows ``(step, config, metric, value)``.

    A later evaluation of the same (step, config) replaces the earlier one (e.g. a resumed run that
    re-evaluates its resume step).
    """

    COLUMNS = ("step", "config", "metric", "value")

    def __init__(self, rows: Sequence[dict[str, Any]] | None = None) -> None:
        self.rows: list[dict[str, Any]] = [dict(r) for r in rows or []]

    def add(self, step: int, config: str, metrics: dict[str, float]) -> None:
        self.rows = [r for r in self.rows if not (r["step"] == step and r["config"] == config)]
        self.rows += [{"step": int(step), "config": config, "metric": m, "value": float(v)} for m, v in metrics.items()]

    @property
    def steps(self) -> list[int]:
        return sorted({r["step"] for r in self.rows})

    @property
    def configs(self) -> list[str]:
        return list(dict.fromkeys(r["config"] for r in self.rows))

    def metrics_at(self, step: int, config: str) -> dict[str, float]:
        return {r["metric"]: r["value"] for r in self.rows if r["step"] == step and r["config"] == config}

    def to_csv(self) -> str:
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=self.COLUMNS, lineterminator="\n")
        w.writeheader()
        for r in sorted(self.rows, key=lambda r: (r["step"], self.configs.index(r["config"]))):
            w.writerow({**r, "value": f"{r['value']:.6g}"})
        return buf.getvalue()

    def to_markdown(self, metrics: Sequence[str] | None = None, percent: bool = False) -> str:
        """One row per checkpoint step, one column per ``config/metric`` (Pass@k and accuracy by default),
        as fractions in [0, 1] like every accuracy lit_rl prints and logs (``percent``: the papers' scale,
        the header then says ``(%)``)."""
        configs = self.configs
        cols: list[tuple[str, str]] = []
        for c in configs:
            names = list(dict.fromkeys(r["metric"] for r in self.rows if r["config"] == c))
            keep = [m for m in names if (metrics is None and (m.startswith("pass@") or m == "accuracy"))
                    or (metrics is not None and m in metrics)]
            cols += [(c, m) for m in keep]
        unit = " (%)" if percent else ""
        header = "| step | " + " | ".join(f"{c} {m}{unit if _is_rate(m) else ''}" for c, m in cols) + " |"
        lines = [header, "|" + "---:|" * (len(cols) + 1)]
        for s in self.steps:
            cells = []
            for c, m in cols:
                v = self.metrics_at(s, c).get(m)
                cells.append("" if v is None else _fmt(v, m, percent))
            lines.append(f"| {s} | " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"

    def report(self, select_metric: str = "pass@1", final_step: int | None = None) -> dict[str, Any]:
        """App. D: per configuration, the checkpoint with the highest ``select_metric`` (earliest on ties)
        and the final checkpoint (``final_step``, default the last step evaluated)."""
        out: dict[str, Any] = {"select_metric": select_metric, "steps": self.steps, "configs": {}}
        for c in self.configs:
            steps = sorted({r["step"] for r in self.rows if r["config"] == c})
            scored = [(self.metrics_at(s, c).get(select_metric), s) for s in steps]
            scored = [(v, s) for v, s in scored if v is not None]
            entry: dict[str, Any] = {}
            if scored:
                best_v = max(v for v, _ in scored)
                best_s = min(s for v, s in scored if v == best_v)
                entry["best"] = {"step": best_s, "metrics": self.metrics_at(best_s, c)}
            fin = final_step if final_step is not None and final_step in steps else (steps[-1] if steps else None)
            if fin is not None:
                entry["final"] = {"step": fin, "metrics": self.metrics_at(fin, c)}
            out["configs"][c] = entry
        return out

    @staticmethod
    def report_markdown(report: dict[str, Any], title: str = "Checkpoint evaluation", notes: Sequence[str] = ()) -> str:
        sel = report["select_metric"]
        lines = [f"# {title}", "",
                 f"Best checkpoint per configuration by `{sel}` and the final checkpoint (ERILS App. D).", ""]
        lines += [f"- {n}" for n in notes]
        if notes:
            lines.append("")
        lines += ["| config | which | step | metrics |", "|---|---|---:|---|"]
        for c, entry in report["configs"].items():
            for which in ("best", "final"):
                if which not in entry:
                    continue
                m = entry[which]["metrics"]
                shown = ", ".join(f"{k} {_fmt(v, k, False)}" for k, v in m.items()
                                  if k.startswith("pass@") or k in ("accuracy", "length_mean"))
                extra = f" (`{entry[which]['checkpoint']}`)" if entry[which].get("checkpoint") else ""
                lines.append(f"| {c} | {which}{extra} | {entry[which]['step']} | {shown} |")
        return "\n".join(lines) + "\n"

    def state(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.rows]


def _is_rate(metric: str) -> bool:
    return metric.startswith(("pass@", "unbiased_pass@")) or metric in ("accuracy", "hit_limit_frac")


def _fmt(value: float, metric: str, percent: bool) -> str:
    """A rate as a fraction with 4 decimals (``percent``: x 100 with 2), other values with 4 significant digits."""
    if _is_rate(metric):
        return f"{100 * value:.2f}" if percent else f"{value:.4f}"
    return f"{value:.4g}" if not float(value).is_integer() else str(int(value))


def dumps_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=False, default=str)
