"""Row kinds in one place (lit_rl/core/sources.py): every stage that treats kinds differently reads KINDS, so
changing one kind's line changes the advantages, the masks, the SFT rows and the metrics together."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lit_rl.algorithms.advantages import ExternalOnly, OnPolicyOnly
from lit_rl.algorithms.erils import source_metrics
from lit_rl.algorithms.surrogates import SPGSurrogate
from lit_rl.batch import RolloutBatch
from lit_rl.core import sources
from lit_rl.core.advantages import source_specific_advantages
from lit_rl.core.sources import KINDS, Source, known, rows_where

ON, EXT, CONT, INP = int(Source.ON_POLICY), int(Source.EXTERNAL), int(Source.CONTINUATION), int(Source.INPAINTED)


def test_the_table_by_hand():
    src = torch.tensor([ON, EXT, CONT, EXT, INP])
    assert rows_where(src, centred=True).tolist() == [True, False, True, False, True]
    assert rows_where(src, decoded=False).tolist() == [False, True, False, True, False]
    assert rows_where(src, counts_as="on_policy").tolist() == [True, False, True, False, True]
    assert known(torch.tensor([0, 1, 2, 3, 4])).tolist() == [True, True, True, True, False]
    assert [s.label for s in Source] == ["on_policy", "external", "continuation", "inpainted"]
    kinds = r"0 \(on_policy\), 1 \(external\), 2 \(continuation\), 3 \(inpainted\)"
    with pytest.raises(ValueError, match=rf"row kind \({kinds}\), got \[7\]"):
        source_specific_advantages(torch.zeros(2), torch.tensor([0, 7]), torch.zeros(2, dtype=torch.long))


@pytest.fixture
def continuation_as_external(monkeypatch):
    """One line of the table changed: continuation rows treated like pool rows."""
    kinds = dict(KINDS)
    kinds[Source.CONTINUATION] = dataclasses.replace(kinds[Source.CONTINUATION], decoded=False, centred=False,
                                                     counts_as="external")
    monkeypatch.setattr(sources, "KINDS", kinds)


def _rows(src: list[int]) -> RolloutBatch:
    n, L = len(src), 4
    ids = torch.randint(3, 9, (n, 2 + L), generator=torch.Generator().manual_seed(0))
    return RolloutBatch(
        input_ids=ids, attention_mask=torch.ones_like(ids), prompt_len=2, completion_mask=torch.ones(n, L).bool(),
        lengths=torch.full((n,), L), rewards=torch.tensor([1.0, 0.0, 1.0, 0.5][:n]), source=torch.tensor(src),
        group=torch.zeros(n, dtype=torch.long), texts=[""] * n, prompt_ids=["p"] * n,
        hit_limit=torch.zeros(n, dtype=torch.bool),
    )


@pytest.mark.parametrize("changed", [False, True])
def test_every_stage_follows_the_table(changed, request):
    if changed:
        request.getfixturevalue("continuation_as_external")
    ro = _rows([ON, ON, CONT, EXT])
    r, s, g = ro.rewards, ro.source, ro.group
    adv = source_specific_advantages(r, s, g)
    # Eq. 9: centred rows minus their mean; the others keep A = r
    want = [1 - 2 / 3, 0 - 2 / 3, 1 - 2 / 3, 0.5] if not changed else [0.5, -0.5, 1.0, 0.5]
    torch.testing.assert_close(adv, torch.tensor(want))
    assert OnPolicyOnly()(r, s, g)[1].tolist() == [True, True, not changed, False]
    assert ExternalOnly()(r, s, g)[1].tolist() == [False, False, changed, True]
    m = source_metrics(ro.with_advantages(adv))
    assert m["train/external/reward_mean"] == pytest.approx(0.75 if changed else 0.5)
    # masks: decoded rows get block masks (whole 2-token blocks after the chosen one), the others uniform ones
    spg = SPGSurrogate(num_t=64, block_length=2, p_mask_prompt=0.0, p_mask_clean=0.0, mask_id=1)
    masks = spg.build_masks(ro.completion_mask, ro.attention_mask[:, :2], s, seeds=[1, 2, 3, 4])
    comp = masks.completion[:, 2]  # (num_t, L) the continuation row
    block_shaped = bool((comp[:, 2:].all(-1) | ~comp[:, :2].any(-1)).all())  # never masked early, clean late
    assert block_shaped != changed
