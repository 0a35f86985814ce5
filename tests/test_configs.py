"""Every YAML under conf/ parses, and every training config builds its model and data (tiny or not)."""

from pathlib import Path

import pytest
import yaml


ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(p for p in (ROOT / "conf").rglob("*.yaml"))
TRAIN_CONFIGS = [p for p in CONFIGS if "model" in (yaml.safe_load(p.read_text()) or {})]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_yaml_parses(path):
    assert isinstance(yaml.safe_load(path.read_text()), dict)


@pytest.mark.parametrize("path", TRAIN_CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_training_config_validates_with_lightning_cli(path, monkeypatch):
    """The LightningCLI parser accepts the config (types, class paths, argument names) without building it."""
    monkeypatch.chdir(ROOT)
    from lightning.pytorch import LightningDataModule, LightningModule, Trainer
    from lightning.pytorch.cli import LightningArgumentParser

    parser = LightningArgumentParser()
    parser.add_lightning_class_args(LightningModule, "model", subclass_mode=True)
    parser.add_lightning_class_args(LightningDataModule, "data", subclass_mode=True)
    parser.add_argument("--seed_everything", type=int | bool | None, default=None)
    parser.add_argument("--threads", type=int | None, default=None)
    parser.add_lightning_class_args(Trainer, "trainer")
    cfg = parser.parse_path(str(path))
    assert cfg.model.class_path and cfg.data.class_path
