"""Hand-computed tests for lit_rl.metrics, incl. DDP-correctness of the metric states."""

import math
import os
import socket
import subprocess
import sys
import textwrap
from fractions import Fraction

import pytest
import torch

from lit_rl.metrics import (
    FirstKPassAtK,
    MeanAccuracy,
    UnbiasedPassAtK,
    first_k_best,
    pass_at_k_unbiased,
)


# ----------------------------------------------------------------------------- unbiased pass@k
@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (4, 1, 1, 0.25),  # c / n
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (4, 0, 4, 0.0),  # nothing correct
        (4, 3, 2, 1.0),  # n - c = 1 < k: every pair holds a correct sample
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10; product form 1 - (1 - 2/4)(1 - 2/5) = 1 - 0.3
        (4, 4, 4, 1.0),
    ],
)
def test_pass_at_k_unbiased_by_hand(n, c, k, expected):
    assert pass_at_k_unbiased(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_unbiased_stable_for_large_n():
    # C(200, 100) ~ 9e58: the product form must match exact rational arithmetic
    exact = 1 - Fraction(math.comb(190, 100), math.comb(200, 100))
    assert pass_at_k_unbiased(200, 10, 100) == pytest.approx(float(exact), rel=1e-12)


def test_pass_at_k_unbiased_errors():
    with pytest.raises(ValueError):
        pass_at_k_unbiased(3, 1, 4)  # k > n
    with pytest.raises(ValueError):
        pass_at_k_unbiased(3, 4, 1)  # c > n


def test_unbiased_metric():
    # prompt 0: 1 of 4 correct -> pass@1 1/4, pass@2 1 - C(3,2)/C(4,2) = 1/2
    # prompt 1: 2 of 4 correct -> pass@1 1/2, pass@2 1 - C(2,2)/C(4,2) = 5/6
    # averages: pass@1 (1/4 + 1/2)/2 = 3/8; pass@2 (1/2 + 5/6)/2 = 2/3; pass@4 = 1
    correct = torch.tensor([[1, 0, 0, 0], [0, 1, 0, 1]], dtype=torch.bool)
    m = UnbiasedPassAtK(ks=(1, 2, 4))
    m.update(correct)
    out = m.compute()
    assert out[1].item() == pytest.approx(3 / 8)
    assert out[2].item() == pytest.approx(2 / 3)
    assert out[4].item() == pytest.approx(1.0)
    # counts interface gives the same
    m2 = UnbiasedPassAtK(ks=(1, 2, 4))
    m2.update(torch.tensor([1, 2]), num_samples=4)
    assert {k: v.item() for k, v in m2.compute().items()} == pytest.approx({k: v.item() for k, v in out.items()})
    with pytest.raises(ValueError):
        UnbiasedPassAtK(ks=(8,)).update(correct)  # n = 4 < k = 8
    with pytest.raises(ValueError):
        UnbiasedPassAtK(ks=(1,)).update(torch.tensor([[0.5, 1.0]]))  # not binary


# ----------------------------------------------------------------------------- first-k pass@k
BINARY = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
# best of first k per prompt: k=1 [0, 0, 1]; k=2 [1, 0, 1]; k=3 [1, 0, 1]; k=4 [1, 1, 1]
BINARY_EXPECTED = {1: 1 / 3, 2: 2 / 3, 3: 2 / 3, 4: 1.0}

SUDOKU = torch.tensor([[0.5, 0.25, 1.0, 0.0], [0.0, 0.5, 0.5, 0.5]])  # cell-accuracy per sample
BLANKS = torch.tensor([4, 8])  # blank cells per puzzle
# k=1: (4*0.5 + 8*0.0)/12 = 1/6;  k=2: (4*0.5 + 8*0.5)/12 = 1/2;  k=3, k=4: (4*1.0 + 8*0.5)/12 = 2/3
SUDOKU_EXPECTED = {1: 1 / 6, 2: 1 / 2, 3: 2 / 3, 4: 2 / 3}


def test_first_k_best_function():
    for k, v in BINARY_EXPECTED.items():
        assert first_k_best(BINARY, None, k) == pytest.approx(v)
    for k, v in SUDOKU_EXPECTED.items():
        assert first_k_best(SUDOKU, BLANKS, k) == pytest.approx(v)


def test_first_k_metric_pools_over_updates():
    m = FirstKPassAtK(k_max=4)
    m.update(SUDOKU[:1], BLANKS[:1])
    m.update(SUDOKU[1:], BLANKS[1:])
    out = m.compute()
    assert set(out) == {1, 2, 3, 4}
    assert {k: v.item() for k, v in out.items()} == pytest.approx(SUDOKU_EXPECTED)
    m.reset()
    m.update(BINARY)  # weights default to 1 per prompt
    assert {k: v.item() for k, v in m.compute().items()} == pytest.approx(BINARY_EXPECTED)


def test_first_k_uses_only_first_k_samples():
    # a correct 5th sample must not count for k <= 4
    m = FirstKPassAtK(k_max=4)
    m.update(torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]]))
    assert all(v.item() == 0 for v in m.compute().values())
    with pytest.raises(ValueError):
        FirstKPassAtK(k_max=4).update(torch.ones(2, 3))  # fewer than k_max samples


def test_mean_accuracy():
    # Sudoku pooled: correct blank cells [3, 0, 5] of [4, 4, 8] -> 8/16
    m = MeanAccuracy()
    m.update(torch.tensor([3, 0, 5]), torch.tensor([4, 4, 8]))
    assert m.compute().item() == pytest.approx(0.5)
    # per-item 0/1: 3 of 4
    m2 = MeanAccuracy()
    m2.update(torch.tensor([1.0, 0.0, 1.0, 1.0]))
    assert m2.compute().item() == pytest.approx(0.75)
    with pytest.warns(UserWarning, match="before the ``update``"):
        assert MeanAccuracy().compute().item() == 0.0  # empty: 0, not NaN


# ----------------------------------------------------------------------------- DDP correctness
def test_merge_state_equals_pooled():
    """Two "ranks" with different data: merging (sum reduce) equals one metric over all the data."""
    a, b = FirstKPassAtK(k_max=4), FirstKPassAtK(k_max=4)
    a.update(SUDOKU[:1], BLANKS[:1])
    b.update(SUDOKU[1:], BLANKS[1:])
    a.merge_state(b)
    assert {k: v.item() for k, v in a.compute().items()} == pytest.approx(SUDOKU_EXPECTED)

    u1, u2 = UnbiasedPassAtK(ks=(1, 2)), UnbiasedPassAtK(ks=(1, 2))
    u1.update(torch.tensor([[1, 0, 0, 0]], dtype=torch.bool))
    u2.update(torch.tensor([[0, 1, 0, 1]], dtype=torch.bool))
    u1.merge_state(u2)
    assert u1.compute()[1].item() == pytest.approx(3 / 8) and u1.compute()[2].item() == pytest.approx(2 / 3)

    m1, m2 = MeanAccuracy(), MeanAccuracy()
    m1.update(torch.tensor([3]), torch.tensor([4]))
    m2.update(torch.tensor([0, 5]), torch.tensor([4, 8]))
    # manual reduce: what DDP's all_reduce(sum) does to each state
    for name in ("correct", "total"):
        setattr(m1, name, getattr(m1, name) + getattr(m2, name))
    assert m1.compute().item() == pytest.approx(0.5)


def test_states_reduce_with_sum():
    for m in (FirstKPassAtK(), UnbiasedPassAtK(), MeanAccuracy()):
        assert m._reductions and all(fx is not None and fx.__name__ == "dim_zero_sum" for fx in m._reductions.values())


_DDP_SCRIPT = textwrap.dedent(
    """
    import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
    from lit_rl.metrics import FirstKPassAtK, MeanAccuracy, UnbiasedPassAtK

    SUDOKU = torch.tensor([[0.5, 0.25, 1.0, 0.0], [0.0, 0.5, 0.5, 0.5]])
    BLANKS = torch.tensor([4, 8])

    def run(rank, port, out):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        m = FirstKPassAtK(k_max=4)
        m.update(SUDOKU[rank : rank + 1], BLANKS[rank : rank + 1])  # each rank sees one puzzle
        u = UnbiasedPassAtK(ks=(1, 2))
        u.update(torch.tensor([[1, 0, 0, 0]] if rank == 0 else [[0, 1, 0, 1]], dtype=torch.bool))
        a = MeanAccuracy()
        if rank == 0:
            a.update(torch.tensor([3]), torch.tensor([4]))
        else:
            a.update(torch.tensor([0, 5]), torch.tensor([4, 8]))
        vals = [v.item() for v in m.compute().values()] + [v.item() for v in u.compute().values()]
        vals.append(a.compute().item())
        with open(f"{out}.{rank}", "w") as f:
            f.write(" ".join(repr(v) for v in vals))
        dist.destroy_process_group()

    if __name__ == "__main__":
        # fork: the children inherit the imported torch/torchmetrics, which keeps this test a few seconds
        mp.start_processes(run, args=(int(sys.argv[1]), sys.argv[2]), nprocs=2, start_method="fork")
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_gloo_sync(tmp_path):
    """Real 2-rank gloo process group: compute() syncs the summed states; both ranks see pooled values."""
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("gloo not available")
    script = tmp_path / "ddp_metrics.py"
    script.write_text(_DDP_SCRIPT)
    out = tmp_path / "vals"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    try:
        proc = subprocess.run(
            [sys.executable, str(script), str(_free_port()), str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        pytest.skip("2-process gloo run timed out on this machine")
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = [SUDOKU_EXPECTED[k] for k in (1, 2, 3, 4)] + [3 / 8, 2 / 3, 0.5]
    for rank in (0, 1):
        vals = [float(v) for v in (tmp_path / f"vals.{rank}").read_text().split()]
        assert vals == pytest.approx(expected)
