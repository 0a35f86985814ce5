"""A user's own policy-gradient objective for the tests: ``loss.objective: support.objectives.halved_clip``."""

from __future__ import annotations

from lit_rl.core.pg import clipped_pg_loss


def halved_clip(logp, old_logp, advantages, mask, **kw):
    """PPO's clipped loss at half weight, with a stat of its own (what a variant written outside lit_rl looks like)."""
    loss, stats = clipped_pg_loss(logp, old_logp, advantages, mask, **kw)
    return loss * 0.5, {**stats, "halved": loss.detach() * 0.5}


def digit_reward(prompts, completions, **kwargs):
    """A TRL-style reward that varies on a random tiny model's output (0.1 per digit, at most 1): a tiny run's
    advantages are then not all 0."""
    from lit_rl.tasks.rewards import completion_text

    return [min(1.0, 0.1 * sum(ch.isdigit() for ch in completion_text(c))) for c in completions]
