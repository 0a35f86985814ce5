"""Moved: the masked-denoising SFT math is :mod:`lit_rl.core.denoising`. The old names still resolve for one
release, with a warning (:mod:`lit_rl.deprecation`)."""

from lit_rl.deprecation import moved_names, old_names

_HOMES = dict.fromkeys(("denoising_masks", "masked_denoising_loss"), "lit_rl.core.denoising")
__getattr__ = moved_names(__name__, _HOMES)
__all__ = old_names(_HOMES)
