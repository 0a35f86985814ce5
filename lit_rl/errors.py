"""lit_rl's user-facing errors: raised where a config, data file or setting is wrong, printed as one line."""

from __future__ import annotations

__all__ = ["CheckpointError", "ConfigError", "FieldError", "RewardError", "one_line"]


class ConfigError(ValueError):
    """A malformed configuration or data file; the message names the field, the file and the line."""


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written, read or resumed from; the one-line message names the file, what is
    wrong and what to do (:mod:`lit_rl.checkpoint_io`, :mod:`lit_rl.resume`)."""


class FieldError(ValueError):
    """A constructor's error about one of its own arguments (``field``, the argument's name).

    Settings classes raise it from ``__post_init__``; the config preflight (:mod:`lit_rl.config.preflight`)
    builds them from the YAML and turns the error into a :class:`ConfigError` at that argument's file:line,
    so a rule is written once, in the class, and reported with its place in the config.
    """

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field, self.problem = field, problem


class RewardError(ValueError):
    """A reward function's output that cannot be a reward (not a list of one number per completion, a string, an
    infinite value); the one-line message names the function, and the row and its prompt id
    (:func:`lit_rl.tasks.rewards.check_reward_output`)."""


def one_line(text: object, limit: int = 300) -> str:
    """The first line of ``text`` (an exception's message, say) for a one-line error, at most ``limit``
    characters: a longer one is cut after its last full sentence that fits, else at a word, never mid-word,
    and ends with an ellipsis."""
    line = (str(text).strip().splitlines() or [""])[0].strip()
    if len(line) <= limit:
        return line
    head = line[: limit - 1]
    end = head.rfind(". ")
    if end >= limit // 3:
        return head[: end + 1] + " …"
    space = head.rfind(" ")
    return (head[:space] if space > 0 else head).rstrip(" ,;:") + "…"
