"""Moved: the masked-denoising SFT baseline is :mod:`lit_rl.algorithms.denoising_sft` (configs name
``lit_rl.algorithms.denoising_sft.DenoisingSFT``). The old name still resolves for one release, with a warning
(:mod:`lit_rl.deprecation`)."""

from lit_rl.deprecation import moved_names, old_names

_HOMES = {"DenoisingSFT": "lit_rl.algorithms.denoising_sft"}
__getattr__ = moved_names(__name__, _HOMES)
__all__ = old_names(_HOMES)
