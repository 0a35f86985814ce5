"""lit_rl's math: pure tensor functions, each with its shapes and the paper (and reference code) it follows.

Nothing here imports Lightning, a model, a task or a container (``tests/test_layering.py`` fails if it
does): only ``torch``, the standard library, :mod:`lit_rl.rng` and other ``lit_rl.core`` modules.

* :mod:`~lit_rl.core.sources` the rollout source enum;
* :mod:`~lit_rl.core.advantages` group centring (GRPO / RLOO / ERILS Eq. 9 and 11), ``frac_reward_zero_std``;
* :mod:`~lit_rl.core.pg` the clipped policy-gradient loss, k3 KL, aggregation, truncation masks;
* :mod:`~lit_rl.core.spg` the SPG surrogate's ELBO / EUBO / mix and loss, d1 and wd1 losses;
* :mod:`~lit_rl.core.masks` noise masks for masked-dLLM likelihood surrogates;
* :mod:`~lit_rl.core.double_rollout` double-rollout reward estimation;
* :mod:`~lit_rl.core.entropy` token entropy.
"""
