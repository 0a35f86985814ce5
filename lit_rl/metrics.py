"""Evaluation metrics: first-k Pass@k (ERILS §V-A), the unbiased Pass@k estimator (Chen et al. 2021),
and pooled accuracy, as torchmetrics ``Metric`` subclasses plus plain functions for tests.

Every metric keeps only sums in its state (``dist_reduce_fx="sum"``), so DDP sync and
``Metric.merge_state`` are exact: the pooled value over all ranks equals the value on the concatenated
data. States are float64 so that sums over thousands of prompts do not lose digits.

Which Pass@k?

* :class:`FirstKPassAtK` — the papers' protocol: n samples per prompt with fixed seeds (1001..1004), and
  Pass@k uses the FIRST k of them: ``best_k = max(score[:k])``. For 0/1 correctness that is "any of the
  first k is correct"; for Sudoku (score = cell accuracy of one completion) it is best-of-k cell accuracy.
  Pooled as ``Σ_p w_p · best_k,p / Σ_p w_p`` (w = blank cells gives Sudoku's pooled cell accuracy; w = 1
  gives the per-prompt average).
* :class:`UnbiasedPassAtK` — ``1 - C(n-c, k)/C(n, k)`` per prompt (n samples, c correct), averaged over
  prompts; lower variance than first-k when n > k.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

__all__ = [
    "FirstKPassAtK",
    "MeanAccuracy",
    "UnbiasedPassAtK",
    "first_k_best",
    "pass_at_k_unbiased",
]


def pass_at_k_unbiased(n: int, c: int, k: int) -> float:
    """Chen et al. (2021) unbiased Pass@k for one prompt: ``1 - C(n-c, k) / C(n, k)``.

    Computed in the stable product form ``1 - Π_{i=n-c+1}^{n} (1 - k/i)`` (no huge binomials).
    If ``n - c < k`` every k-subset contains a correct sample: 1.0. Needs ``1 <= k <= n``, ``0 <= c <= n``.

    >>> pass_at_k_unbiased(4, 1, 1)
    0.25
    >>> round(pass_at_k_unbiased(4, 1, 2), 6)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    0.5
    """
    if not (1 <= k <= n):
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    if not (0 <= c <= n):
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def _pass_at_k_tensor(n: Tensor, c: Tensor, k: int) -> Tensor:
    """Vectorised :func:`pass_at_k_unbiased`. Shapes: ``n``, ``c`` ``(P,)`` integer → ``(P,)`` float64."""
    n = n.to(torch.int64)
    c = c.to(torch.int64)
    if bool((n < k).any()):
        raise ValueError(f"UnbiasedPassAtK needs n >= k for every prompt; k={k}, min n={int(n.min())}")
    n_max = int(n.max()) if n.numel() else 0
    i = torch.arange(1, n_max + 1, device=n.device, dtype=torch.float64)  # (n_max,)
    # log(1 - k/i); set to 0 for i <= k (there 1 - k/i <= 0). Those factors only occur when n - c < k,
    # whose result is overwritten with 1 below, so the zeros never change a returned value.
    log_factor = torch.log1p(-torch.where(i > k, k / i, torch.zeros_like(i)))  # (n_max,)
    use = (i.unsqueeze(0) > (n - c).unsqueeze(1)) & (i.unsqueeze(0) <= n.unsqueeze(1))  # (P, n_max)
    log_prod = (log_factor.unsqueeze(0) * use).sum(dim=1)  # (P,) log C(n-c, k)/C(n, k)
    value = 1.0 - torch.exp(log_prod)  # (P,)
    return torch.where(n - c < k, torch.ones_like(value), value)


def _best_of_first_k(scores: Tensor, k_max: int) -> Tensor:
    """``best[:, k-1] = max(scores[:, :k])`` for k = 1..k_max. Shape ``(P, n)`` → ``(P, k_max)`` float64."""
    if scores.ndim != 2:
        raise ValueError(f"scores must be (P, n), got {tuple(scores.shape)}")
    if scores.shape[1] < k_max:
        raise ValueError(f"need at least k={k_max} samples per prompt, got n={scores.shape[1]}")
    return torch.cummax(scores[:, :k_max].to(torch.float64), dim=1).values  # (P, k_max)


def _weights(weights: Tensor | None, P: int, device: torch.device) -> Tensor:
    if weights is None:
        return torch.ones(P, dtype=torch.float64, device=device)
    w = torch.as_tensor(weights, device=device).to(torch.float64).reshape(-1)
    if w.shape != (P,):
        raise ValueError(f"weights must be (P,)={P}, got {tuple(w.shape)}")
    return w


def first_k_best(scores: Tensor, weights: Tensor | None, k: int) -> float:
    """Pooled best-of-first-k: ``Σ_p w_p · max(scores[p, :k]) / Σ_p w_p``.

    Shapes: ``scores`` ``(P, n)`` in [0, 1] with n >= k; ``weights`` ``(P,)`` or None (all 1).
    """
    best = _best_of_first_k(scores, k)[:, k - 1]  # (P,)
    w = _weights(weights, scores.shape[0], scores.device)  # (P,)
    return float((w * best).sum() / w.sum()) if float(w.sum()) > 0 else 0.0


class FirstKPassAtK(Metric):
    """Pass@k for k = 1..k_max from the FIRST k samples of each prompt, pooled with weights.

    ``update(scores (P, n), weights (P,) | None)``: ``scores[p, s]`` in [0, 1] is sample s's score on
    prompt p (1 = correct; Sudoku: cell-accuracy fraction), samples in seed order; ``weights[p]`` is the
    number of units the prompt counts for (Sudoku: blank cells; default 1). ``compute() -> {k: value}``.
    """

    full_state_update = False
    higher_is_better = True
    is_differentiable = False

    def __init__(self, k_max: int = 4, **kwargs) -> None:
        super().__init__(**kwargs)
        if k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {k_max}")
        self.k_max = k_max
        self.add_state("weighted_best", torch.zeros(k_max, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total_weight", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, scores: Tensor, weights: Tensor | None = None) -> None:
        best = _best_of_first_k(scores, self.k_max)  # (P, k_max)
        w = _weights(weights, scores.shape[0], best.device)  # (P,)
        self.weighted_best += (w.unsqueeze(1) * best).sum(dim=0).to(self.weighted_best.device)  # (k_max,)
        self.total_weight += w.sum().to(self.total_weight.device)

    def compute(self) -> dict[int, Tensor]:
        denom = self.total_weight.clamp(min=torch.finfo(torch.float64).tiny)
        values = torch.where(self.total_weight > 0, self.weighted_best / denom, torch.zeros_like(self.weighted_best))
        return {k: values[k - 1] for k in range(1, self.k_max + 1)}


class UnbiasedPassAtK(Metric):
    """Chen et al. (2021) unbiased Pass@k, averaged over prompts, for each k in ``ks``.

    ``update(correct (P, n))`` with 0/1 or bool correctness, or ``update(num_correct (P,), num_samples=…)``
    with counts (``num_samples`` an int or ``(P,)``). Every prompt needs n >= max(ks).
    ``compute() -> {k: value}``.
    """

    full_state_update = False
    higher_is_better = True
    is_differentiable = False

    def __init__(self, ks: Sequence[int] = (1, 2, 4), **kwargs) -> None:
        super().__init__(**kwargs)
        ks = tuple(int(k) for k in ks)
        if not ks or min(ks) < 1:
            raise ValueError(f"ks must be non-empty positive ints, got {ks}")
        self.ks = ks
        self.add_state("pass_sum", torch.zeros(len(ks), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("num_prompts", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, correct: Tensor, num_samples: int | Tensor | None = None) -> None:
        if num_samples is None:
            if correct.ndim != 2:
                raise ValueError("correct must be (P, n) when num_samples is not given")
            if correct.dtype != torch.bool and not bool(((correct == 0) | (correct == 1)).all()):
                raise ValueError("correct must be bool or 0/1 (the unbiased estimator needs binary outcomes)")
            c = correct.bool().sum(dim=1)  # (P,)
            n = torch.full_like(c, correct.shape[1])  # (P,)
        else:
            c = correct.reshape(-1).to(torch.int64)  # (P,)
            n = torch.as_tensor(num_samples, device=c.device).to(torch.int64).expand_as(c)  # (P,)
            if bool((c > n).any()) or bool((c < 0).any()):
                raise ValueError("need 0 <= num_correct <= num_samples")
        values = torch.stack([_pass_at_k_tensor(n, c, k).sum() for k in self.ks])  # (len(ks),)
        self.pass_sum += values.to(self.pass_sum.device)
        self.num_prompts += float(c.numel())

    def compute(self) -> dict[int, Tensor]:
        values = self.pass_sum / self.num_prompts.clamp(min=1)
        return {k: values[i] for i, k in enumerate(self.ks)}


class MeanAccuracy(Metric):
    """Pooled accuracy ``Σ correct / Σ total``.

    ``update(correct, total=None)``: with ``total`` both are per-item counts (Sudoku: correct blank cells
    and blank cells, so the result is pooled cell accuracy); without, ``correct`` holds per-item scores in
    [0, 1] and each item counts once.
    """

    full_state_update = False
    higher_is_better = True
    is_differentiable = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("correct", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, correct: Tensor, total: Tensor | None = None) -> None:
        correct = torch.as_tensor(correct).to(torch.float64).reshape(-1)
        if total is None:
            total_sum = float(correct.numel())
        else:
            t = torch.as_tensor(total).to(torch.float64).reshape(-1)
            if t.shape != correct.shape:
                raise ValueError(f"total must match correct's shape {tuple(correct.shape)}, got {tuple(t.shape)}")
            total_sum = t.sum()
        self.correct += correct.sum().to(self.correct.device)
        self.total += torch.as_tensor(total_sum, dtype=torch.float64).to(self.total.device)

    def compute(self) -> Tensor:
        return torch.where(self.total > 0, self.correct / self.total.clamp(min=1e-300), torch.zeros_like(self.total))

