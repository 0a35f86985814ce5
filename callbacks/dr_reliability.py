"""The double-rollout reliability study during training (DR Fig. 1-2; :mod:`lit_rl.algorithms.dr_reliability`).

:class:`ContinuationReliability` collects, after every rollout batch, each first-stage rollout's correctness,
its continuations' accuracy, its length and its prompt's pass rate from the module's estimate
(``batch.diagnostics["double_rollout"]``, the estimate's processor's output), and at the end of training writes
``<run dir>/reliability.json`` and ``reliability.md`` (continuation accuracy after correct / incorrect rollouts, by
length tercile and by prompt difficulty), logs the ``all`` row as ``reliability/cont_acc_after_{correct,incorrect}`` and
the files as MLflow artifacts. Rows are checkpointed, so a resumed run reports the whole run.
"""

from __future__ import annotations

import json
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import MLFlowLogger

from lit_rl.algorithms.dr_reliability import reliability_rows, reliability_table, table_markdown
from lit_rl.atomic import atomic_write_text
from lit_rl.errors import FieldError
from lit_rl.runs import run_dir

__all__ = ["ContinuationReliability"]

FIELDS = ("correct", "cont_acc", "length", "pass_rate")


class ContinuationReliability(L.Callback):
    """Accumulate the reliability study's rows over training and write the table at the end.

    Args:
        length_bins: quantile bins of completion length (3: tertiles).
        output_dir: where to write the table (default: the run folder).
    """

    @staticmethod
    def check_args(length_bins: int = 3) -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`)."""
        if length_bins < 1:
            raise FieldError("length_bins", f"must be >= 1, got {length_bins}")

    def __init__(self, length_bins: int = 3, output_dir: str | None = None) -> None:
        ContinuationReliability.check_args(length_bins=length_bins)
        self.length_bins, self.output_dir = length_bins, output_dir
        self.rows: dict[str, list[torch.Tensor]] = {k: [] for k in FIELDS}

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        est = getattr(batch, "diagnostics", {}).get("double_rollout")
        if est is None or not est.correct or est.original_lengths is None or not bool(est.has_continuations.any()):
            return
        got = reliability_rows(est.correct["original"], est.correct["continuations"], est.has_continuations,
                               est.original_lengths, est.group)
        for k in FIELDS:
            self.rows[k].append(got[k])

    def collected(self) -> dict[str, torch.Tensor]:
        return {k: (torch.cat(v) if v else torch.zeros(0)) for k, v in self.rows.items()}

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        rows = self.collected()
        if not trainer.is_global_zero or len(rows["correct"]) == 0:
            return
        rows["correct"] = rows["correct"].bool()
        table = reliability_table(rows, self.length_bins)
        folder = run_dir(trainer, self.output_dir)
        folder.mkdir(parents=True, exist_ok=True)
        paths = [
            atomic_write_text(folder / "reliability.json",
                              json.dumps({"rows": len(rows["correct"]), "table": table}, indent=1) + "\n"),
            atomic_write_text(folder / "reliability.md", table_markdown(table)),
            # the raw rows, so that several runs can be pooled into one table with common bins
            atomic_write_text(folder / "reliability_rows.json",
                              json.dumps({k: v.tolist() for k, v in rows.items()}) + "\n"),
        ]
        overall = {r["rollout"]: r["cont_acc"] for r in table if r["by"] == "all"}
        metrics = {f"reliability/cont_acc_after_{k}": v for k, v in overall.items() if v is not None}
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
            if isinstance(logger, MLFlowLogger):
                for p in paths:
                    logger.experiment.log_artifact(logger.run_id, str(p))

    def state_dict(self) -> dict[str, Any]:
        return {k: [t.tolist() for t in v] for k, v in self.rows.items()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        dtypes = {"correct": torch.bool, "cont_acc": torch.float32, "length": torch.long, "pass_rate": torch.float32}
        self.rows = {k: [torch.tensor(x, dtype=dtypes[k]) for x in state_dict.get(k, [])] for k in FIELDS}
