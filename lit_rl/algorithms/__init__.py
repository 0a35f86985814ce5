"""RL algorithms: the parts modules are built from (advantage processors, the SPG surrogate) and the
LightningModules; the pure math they call is :mod:`lit_rl.core` (re-exported here for existing imports)."""

from lit_rl.algorithms.advantages import (
    AdvantageProcessor,
    ExternalOnly,
    Joint,
    OnPolicyOnly,
    SourceSpecific,
    group_centered,
    joint_advantages,
    source_specific_advantages,
)
from lit_rl.core.masks import (
    BLOCK_CHOICES,
    DiffusionMasks,
    apply_masks,
    full_completion_masks,
    mask_prompt_tokens,
    spg_block_choice,
    spg_block_masks,
    uniform_block_choice,
    uniform_random_masks,
)
from lit_rl.algorithms.surrogates import (
    SPGSurrogate,
    d1_loss,
    elbo,
    eubo,
    mix,
    sequence_logprob_sum,
    spg_loss,
    spg_select,
    token_logprobs_from_logits,
    wd1_loss,
)

__all__ = [
    # advantages
    "AdvantageProcessor",
    "ExternalOnly",
    "Joint",
    "OnPolicyOnly",
    "SourceSpecific",
    "group_centered",
    "joint_advantages",
    "source_specific_advantages",
    # masks
    "BLOCK_CHOICES",
    "DiffusionMasks",
    "apply_masks",
    "full_completion_masks",
    "mask_prompt_tokens",
    "spg_block_choice",
    "spg_block_masks",
    "uniform_block_choice",
    "uniform_random_masks",
    # surrogates
    "SPGSurrogate",
    "d1_loss",
    "elbo",
    "eubo",
    "mix",
    "sequence_logprob_sum",
    "spg_loss",
    "spg_select",
    "token_logprobs_from_logits",
    "wd1_loss",
]
