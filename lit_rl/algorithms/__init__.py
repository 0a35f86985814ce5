"""RL algorithms: pure math (advantages, masks, surrogates) and the LightningModules built on it."""

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
from lit_rl.algorithms.masks import (
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
    SOURCE_EXTERNAL,
    SOURCE_ON_POLICY,
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
    "SOURCE_EXTERNAL",
    "SOURCE_ON_POLICY",
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
