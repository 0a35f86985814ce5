"""Moved: the resume-safety callbacks are :mod:`callbacks.resume` (configs name ``callbacks.ExactResume`` or
``callbacks.resume.ExactResume``). The old names still resolve for one release, with a warning
(:mod:`lit_rl.deprecation`)."""

from lit_rl.deprecation import moved_names, old_names

_HOMES = dict.fromkeys(("CheckpointOnSigterm", "ExactResume", "PromptLedger"), "callbacks.resume")
__getattr__ = moved_names(__name__, _HOMES)
__all__ = old_names(_HOMES)
