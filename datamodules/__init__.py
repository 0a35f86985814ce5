"""LightningDataModules: prompt streams, external-pool alignment and per-batch rollout production."""

from datamodules.ar_rollouts import ARRolloutDataModule, ProfilingSettings
from datamodules.rollouts import RolloutDataModule
from datamodules.stream import PromptStreamDataModule

__all__ = ["ARRolloutDataModule", "ProfilingSettings", "PromptStreamDataModule", "RolloutDataModule"]
