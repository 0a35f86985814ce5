"""Moved: the resume-safety callbacks are :mod:`callbacks.resume` (configs name ``callbacks.ExactResume`` or
``callbacks.resume.ExactResume``). The old names still resolve for one release, with a warning
(:mod:`lit_rl.deprecation`)."""

from lit_rl.deprecation import moved_names

__getattr__ = moved_names(__name__, dict.fromkeys(("CheckpointOnSigterm", "ExactResume", "PromptLedger"),
                                                  "callbacks.resume"))
