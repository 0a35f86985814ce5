"""IGPO's inpainting as a rollout stage and a processor: hinted rows for the groups the policy gets all wrong.

IGPO (Zhao et al., "Inpainting-Guided Policy Optimization for Diffusion Large Language Models", arXiv:2509.10396)
fires on a group whose rollouts are all wrong by binary correctness, decodes new rows with chunks of a reference
trace held fixed (the *hints*) and lets the dLLM fill in the rest; correct inpainted rows replace some of the
failed ones, so the group's advantages are no longer all zero. One rollout batch::

    DataModule  first stage (G_on rollouts per prompt, + the pool's rows)  ->  InpaintStage.run
                    per triggered group: G hinted canvases, decoded by the policy, scored        (batch.inpainted)
    module      InpaintReplace.process (correct inpainted rows replace failed on-policy rows, Source.INPAINTED)
                ->  the advantage processor (OnPolicyOnly / SourceSpecific: the inpainted rows are centred with
                    the on-policy rows)  ->  the loss (d1's with ``hint_keep_ratio``: IGPO's entropy filter)

The pure parts (trigger, chunks, canvas, entropy filter) are :mod:`lit_rl.core.inpainting`; ``docs/inpainting.md``
lists the departures from IGPO's code (hint positions are the trace's own, no gap stretching; hints from the task's
scripted reference trace or the external pool).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Any, Literal

import torch
from lightning.pytorch.utilities import rank_zero_warn

from lit_rl import rng
from lit_rl.algorithms.dr_stage import RolloutStage
from lit_rl.algorithms.processors import Processor
from lit_rl.batch import Inpainted, PromptBatch, RolloutBatch
from lit_rl.core.inpainting import hint_canvas, hint_chunks, triggered_groups
from lit_rl.core.sources import Source
from lit_rl.errors import FieldError
from lit_rl.tasks.rewards import completion_id_lists

__all__ = ["InpaintReplace", "InpaintSettings", "InpaintStage", "replacement_pairs"]


@dataclass
class InpaintSettings:
    """IGPO's inpainting (its code's values in brackets; the embedded configs scale the token counts to L_gen 48).

    Attributes:
        enabled: run the stage (``false``: the processor passes the rows through).
        hint_source: ``"reference"``: the task's scripted reference trace (its registry entry's recipe trace, e.g.
            Sudoku's ``grid``), else the example's ``meta["solution"]`` text; ``"pool"``: the group's first external
            record whose reward counts as correct.
        trace: the scripted trace style for ``"reference"`` (``null``: the task's recipe trace).
        rows_per_group: hinted rows decoded per triggered group (``null``: the group's on-policy count) [G = 8].
        replace_fraction: at most ``max(1, floor(fraction · G_on))`` failed on-policy rows of a group are replaced,
            by its correct inpainted rows in order [4 of 8 = 0.5].
        chunk_min, chunk_max: hint chunk lengths in tokens [5, 10 of L_gen 256].
        shown_min, shown_max: each row's share of chunks shown, r ~ U[shown_min, shown_max] [0.2, 0.6].
        reserve: positions at the end of the canvas never hinted (the trace is cut to ``L_gen - reserve``) [30].
        append_eos: end the reference trace with the policy's EOS before it is cut and chunked, so a shown last
            chunk also fixes where the row ends (IGPO's code hints text tokens only; ``false`` does the same).
        temperature: decoding temperature of the hinted rows (``null``: the first stage's) [1.2 both].
        correct_threshold: verifier score at or above which a row is correct (``null``: the task's
            ``correct_reward``). Correctness is the task's own verifier (``Task.reward``), as IGPO's correctness
            reward: extra reward functions (a format reward) neither block the trigger nor make a row correct.
    """

    enabled: bool = True
    hint_source: Literal["reference", "pool"] = "reference"
    trace: str | None = None
    rows_per_group: int | None = None
    replace_fraction: float = 0.5
    chunk_min: int = 5
    chunk_max: int = 10
    shown_min: float = 0.2
    shown_max: float = 0.6
    reserve: int = 30
    append_eos: bool = True
    temperature: float | None = None
    correct_threshold: float | None = None

    def __post_init__(self) -> None:
        if self.hint_source not in ("reference", "pool"):
            raise FieldError("hint_source", f"must be 'reference' or 'pool', got {self.hint_source!r}")
        if self.rows_per_group is not None and self.rows_per_group < 1:
            raise FieldError("rows_per_group", f"must be >= 1 or null, got {self.rows_per_group}")
        if not 0 < self.replace_fraction <= 1:
            raise FieldError("replace_fraction", f"must be in (0, 1], got {self.replace_fraction}")
        if not 1 <= self.chunk_min <= self.chunk_max:
            raise FieldError("chunk_min", f"need 1 <= chunk_min <= chunk_max, got {self.chunk_min}, "
                                                   f"{self.chunk_max}")
        if not 0 <= self.shown_min <= self.shown_max <= 1:
            raise FieldError("shown_min", f"need 0 <= shown_min <= shown_max <= 1, got {self.shown_min}, "
                                                   f"{self.shown_max}")
        if self.reserve < 0:
            raise FieldError("reserve", f"must be >= 0, got {self.reserve}")
        if self.temperature is not None and self.temperature < 0:
            raise FieldError("temperature", f"must be >= 0 or null, got {self.temperature}")


def _threshold(settings: InpaintSettings, task: Any) -> float:
    if settings.correct_threshold is not None:
        return float(settings.correct_threshold)
    return float(getattr(task, "correct_reward", 1.0))


class InpaintStage(RolloutStage):
    """IGPO's hinted rows for the triggered groups, decoded with the DataModule's dLLM engine
    (:meth:`~lit_rl.generation.continuations.DiffusionContinuations.decode_canvases`: the training decode's block
    schedule, the hints never masked), scored with the batch's task, into ``batch.inpainted``.

    Stats: ``train/inpaint/trigger_rate`` (share of groups whose on-policy rows were all wrong),
    ``train/inpaint/no_reference`` (triggered groups without a reference trace), ``train/inpaint/rows`` (hinted
    rows decoded), ``train/inpaint/correct_frac`` and ``train/inpaint/reward_mean`` (of the hinted rows),
    ``train/inpaint/hint_frac`` (hinted share of their completion tokens), ``train/cost/tokens_inpaint`` (positions
    decoded per prompt, hints excluded), ``time/inpaint_s``.
    """

    def __init__(self, settings: InpaintSettings, seed: int = 0) -> None:
        self.settings, self.seed = settings, seed
        self._warned: set[str] = set()

    def _warn_once(self, key: str, msg: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            rank_zero_warn(msg)

    def reference(self, batch: PromptBatch, g: int, threshold: float) -> str | None:
        """The reference trace of group ``g``, or ``None`` (said once per reason)."""
        s, task, ex = self.settings, batch.task, batch.examples[g]
        if s.hint_source == "pool":
            recs = batch.external[g] if g < len(batch.external) else []
            for r in recs:
                if float(r.reward) >= threshold:
                    return r.completion
            self._warn_once("pool", "inpainting: a triggered group has no correct external record to take hints "
                                    "from (hint_source: pool); such groups are left as they are "
                                    "(train/inpaint/no_reference counts them)")
            return None
        from lit_rl.tasks.registry import known_traces, task_entry

        name = getattr(task, "name", "")
        traces = known_traces(name)
        if traces:
            style = s.trace or task_entry(name).recipe_trace or next(iter(traces))
            if style not in traces:
                raise FieldError("trace",
                                 f"task {name!r} has no trace style {style!r} (known: {sorted(traces)})")
            return traces[style](ex, random.Random(0), 0.0)
        sol = ex.meta.get("solution") if isinstance(ex.meta, dict) else None
        if isinstance(sol, str) and sol:
            return sol
        self._warn_once("reference", f"inpainting: task {name!r} has no scripted reference trace and its examples "
                                     "no meta['solution']; triggered groups are left as they are "
                                     "(train/inpaint/no_reference counts them)")
        return None

    def run(self, batch: PromptBatch, rollouts: RolloutBatch, policy: torch.nn.Module, engine: Any) -> None:
        if not self.settings.enabled:
            return
        t0 = time.perf_counter()
        s, task, examples = self.settings, batch.task, batch.examples
        if task is None or not hasattr(engine, "decode_canvases"):
            raise RuntimeError("the inpainting stage needs the batch's task and a dLLM engine (decode_canvases): use "
                               "datamodules.RolloutDataModule with a diffusion policy")
        threshold = _threshold(s, task)
        B_p = len(examples)
        on = rollouts.source == int(Source.ON_POLICY)  # (N,)
        if task.extra_reward_funcs:  # the rows' rewards add extra functions: re-score the on-policy rows' verifier
            group_list, on_list = rollouts.group.tolist(), on.tolist()
            verifier = torch.tensor([float(task.reward(rollouts.texts[i], examples[group_list[i]])) if on_list[i]
                                     else 0.0 for i in range(len(rollouts))])  # (N,) the task's own score
        else:  # the rows' rewards are the verifier's: no second scoring pass
            verifier = rollouts.rewards.float().cpu()  # (N,)
        trig = triggered_groups(verifier, rollouts.group, on, threshold, B_p)  # (B_p,)
        L = int(engine.settings.gen_length)
        P = rollouts.prompt_len
        group_cpu = rollouts.group.cpu()
        on_cpu = on.cpu()
        no_ref = torch.zeros(B_p, dtype=torch.bool)
        canvases, hints, groups, firsts = [], [], [], []
        for g in trig.nonzero().flatten().tolist():
            text = self.reference(batch, g, threshold)
            if text is None:
                no_ref[g] = True
                continue
            trace = list(policy.tokenizer(text, add_special_tokens=False)["input_ids"])
            trace += [policy.eos_id] if s.append_eos else []
            trace = trace[: max(L - s.reserve, 0)]
            mine = ((group_cpu == g) & on_cpu).nonzero().flatten()
            n_rows = s.rows_per_group or len(mine)
            draw = random.Random(rng.seed_for(self.seed, rng.Stream.INPAINT, rank=batch.rank, step=batch.step,
                                              row=g + 1))
            for _ in range(n_rows):
                chunks = hint_chunks(len(trace), s.chunk_min, s.chunk_max, draw)
                c, h = hint_canvas(trace, chunks, draw.uniform(s.shown_min, s.shown_max), L, policy.mask_id, draw)
                canvases.append(c)
                hints.append(h)
                groups.append(g)
                firsts.append(int(mine[0]))
        device = rollouts.rewards.device
        M = len(canvases)
        if M:
            canvas = torch.stack(canvases)  # (M, L)
            idx = torch.tensor(firsts)
            comp = engine.decode_canvases(
                rollouts.input_ids[idx, :P], rollouts.attention_mask[idx, :P], canvas,
                temperature=s.temperature if s.temperature is not None else float(batch.generation.temperature),
                seed=rng.seed_for(self.seed, rng.Stream.INPAINT, rank=batch.rank, step=batch.step),
            ).to(device)  # (M, L)
            hint = torch.stack(hints).to(device)  # (M, L)
            if not torch.equal(comp[hint], canvas.to(device)[hint]):
                raise RuntimeError("inpainting: the decode changed a hint token (decode_canvases must keep them)")
            lengths = policy.completion_lengths(comp)  # (M,)
            hint &= torch.arange(L, device=device)[None, :] < lengths[:, None]  # hints after the first EOS are moot
            texts = policy.decode_completions(comp)
            scores = task.total_rewards(texts, [examples[g] for g in groups],
                                        completion_ids=completion_id_lists(comp, lengths) if task.extra_reward_funcs
                                        else None)  # as the first stage scores its rows
            rewards = torch.tensor(scores.totals, dtype=torch.float32, device=device)
            correct = torch.tensor(scores.per_func[f"{task.name}_reward"], device=device) >= threshold
            hit = (comp != policy.eos_id).all(-1)
            decoded = int((canvas == policy.mask_id).sum())
        else:
            comp = torch.zeros(0, L, dtype=torch.long, device=device)
            hint = torch.zeros(0, L, dtype=torch.bool, device=device)
            lengths = torch.zeros(0, dtype=torch.long, device=device)
            rewards = torch.zeros(0, device=device)
            correct = torch.zeros(0, dtype=torch.bool, device=device)
            texts, hit, decoded = [], torch.zeros(0, dtype=torch.bool, device=device), 0
        inp = Inpainted(
            row=rollouts.row.clone(), triggered=trig.to(device), no_reference=no_ref.to(device),
            group=torch.tensor(groups, dtype=torch.long, device=device), completion=comp, hint=hint, lengths=lengths,
            rewards=rewards, correct=correct, texts=texts, hit_limit=hit, tokens_decoded=decoded,
            seconds=time.perf_counter() - t0,
        )
        batch.put(inp)
        stats = {
            "train/inpaint/trigger_rate": float(trig.float().mean()) if B_p else 0.0,
            "train/inpaint/no_reference": float(no_ref.sum()),
            "train/inpaint/rows": float(M),
            "train/cost/tokens_inpaint": decoded / max(B_p, 1),
            "time/inpaint_s": inp.seconds,
        }
        if M:
            stats |= {"train/inpaint/correct_frac": float(inp.correct.float().mean()),
                      "train/inpaint/reward_mean": float(rewards.mean()),
                      "train/inpaint/hint_frac": float(hint.sum()) / max(int(lengths.sum()), 1)}
        batch.stats.update(stats)


def replacement_pairs(group: torch.Tensor, on_policy: torch.Tensor, triggered: torch.Tensor, new_group: torch.Tensor,
                      new_correct: torch.Tensor, fraction: float) -> list[tuple[int, int]]:
    """``[(slot, new), ...]`` sorted by slot: in each triggered group, its first ``k`` on-policy rows (all wrong)
    take its first ``k`` correct inpainted rows, ``k = min(#correct, max(1, floor(fraction · G_on)))`` (IGPO: up to
    4 of 8; wrong inpainted rows are discarded).

    Shapes: ``group (N,)``, ``on_policy (N,)`` bool, ``triggered (B_p,)`` bool, ``new_group (M,)``,
    ``new_correct (M,)`` bool.
    """
    group, on_policy, new_group, new_correct = (t.cpu() for t in (group, on_policy, new_group, new_correct))
    pairs = []
    for g in triggered.cpu().nonzero().flatten().tolist():
        slots = ((group == g) & on_policy).nonzero().flatten().tolist()
        good = ((new_group == g) & new_correct).nonzero().flatten().tolist()
        k = min(len(good), len(slots), max(1, math.floor(fraction * len(slots))))
        pairs += list(zip(slots[:k], good[:k]))
    return sorted(pairs)


class InpaintReplace(Processor):
    """IGPO's replacement: correct inpainted rows (``batch.inpainted``, made by this processor's ``stage``, an
    :class:`InpaintStage` the DataModule runs after the first stage) overwrite failed on-policy rows of their group
    (:func:`replacement_pairs`), tagged ``Source.INPAINTED`` with their ``hint_mask``. Sets no advantages: an
    advantage processor follows it in the chain (``processors: [InpaintReplace, OnPolicyOnly]``).

    Stats: ``train/inpaint/rows_replaced`` (per batch) and ``train/inpaint/replaced_reward_mean``.

    Args:
        settings: :class:`InpaintSettings`.
        seed: seed of the hints and the hinted rows' decoding (``null``: the module's ``seed``).
    """

    fsdp2_unsupported = ("ranks decode different numbers of hinted rows (only triggered groups get them), so the "
                         "sharded forward passes would not line up and would hang")

    def __init__(self, settings: InpaintSettings | None = None, seed: int | None = None) -> None:
        self.settings = settings if settings is not None else InpaintSettings()
        self.seed = seed
        self.policy: Any = None
        self._stage: InpaintStage | None = None

    @property
    def stage(self) -> InpaintStage | None:  # type: ignore[override]
        """The stage the DataModule runs before this processor (``None`` when off)."""
        if not self.settings.enabled:
            return None
        if self._stage is None:  # one stage per processor: it says each missing reference once
            self._stage = InpaintStage(self.settings, seed=self.seed or 0)
        return self._stage

    def bind(self, policy: torch.nn.Module) -> None:
        self.policy = policy

    def process(self, rollouts: RolloutBatch, batch: PromptBatch) -> RolloutBatch:
        if not self.settings.enabled:
            return rollouts
        inp = batch.inpainted
        if inp is None:
            raise RuntimeError("InpaintReplace: batch.inpainted is missing: the DataModule runs the module's "
                               "inpainting stage (RLModule.rollout_stages) after the first stage")
        if not torch.equal(inp.row.cpu(), rollouts.row.cpu()):
            raise RuntimeError("InpaintReplace: batch.inpainted was made for other rows than the processor got "
                               "(put InpaintReplace first in the processor chain)")
        on = rollouts.source == int(Source.ON_POLICY)
        pairs = replacement_pairs(rollouts.group, on, inp.triggered, inp.group, inp.correct,
                                  self.settings.replace_fraction)
        batch.stats["train/inpaint/rows_replaced"] = float(len(pairs))
        if not pairs:
            return rollouts
        slots = torch.tensor([i for i, _ in pairs], device=rollouts.input_ids.device)
        new = torch.tensor([j for _, j in pairs], device=inp.completion.device)
        where = torch.zeros(len(rollouts), dtype=torch.bool, device=rollouts.input_ids.device)
        where[slots] = True
        sub = rollouts.select(where)  # (k, ·) in slot order: prompts, row ids and widths stay the slots'
        P, L, Lg = rollouts.prompt_len, rollouts.completion_ids.shape[1], inp.completion.shape[1]
        comp = sub.completion_ids.clone()  # (k, L)
        comp[:, :Lg] = inp.completion[new].to(comp.device)
        hint = torch.zeros_like(sub.hint_mask)
        hint[:, :Lg] = inp.hint[new].to(hint.device)
        lengths = inp.lengths[new].to(sub.lengths.device)
        rows = RolloutBatch(
            input_ids=torch.cat([sub.input_ids[:, :P], comp], 1), attention_mask=sub.attention_mask, prompt_len=P,
            completion_mask=torch.arange(L, device=comp.device)[None, :] < lengths[:, None], lengths=lengths,
            rewards=inp.rewards[new].to(sub.rewards.device).to(sub.rewards.dtype),
            source=torch.full_like(sub.source, int(Source.INPAINTED)), group=sub.group,
            texts=[inp.texts[j] for j in new.tolist()], prompt_ids=sub.prompt_ids,
            hit_limit=inp.hit_limit[new].to(sub.hit_limit.device), eval_total=sub.eval_total, row=sub.row,
            gen_width=sub.gen_width, kept_prefix=torch.zeros_like(sub.kept_prefix), hint_mask=hint,
        )
        batch.stats["train/inpaint/replaced_reward_mean"] = float(rows.rewards.float().mean())
        return rollouts.scatter(where, rows)

    def __repr__(self) -> str:
        return f"InpaintReplace({self.settings}, seed={self.seed})"
