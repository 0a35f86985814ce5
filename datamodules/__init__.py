"""LightningDataModules: prompt streams, external-pool alignment and per-batch rollout production."""

from datamodules.rollouts import RolloutDataModule

__all__ = ["RolloutDataModule"]
