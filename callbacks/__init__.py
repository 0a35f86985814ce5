"""Lightning callbacks: format warm-up, Pass@k checkpoint evaluation, length and reward tracking."""

from callbacks.ar_warmup import ScriptedSFTWarmup
from callbacks.decode_agreement import DecodeAgreement
from callbacks.dr_reliability import ContinuationReliability
from callbacks.final_validation import FinalValidation
from callbacks.passk import PassAtKEvaluation
from callbacks.progress import RolloutProgressBar
from callbacks.resume import CheckpointOnSigterm, ExactResume, PromptLedger
from callbacks.run_record import RunRecord
from callbacks.tracking import RolloutTracker
from callbacks.warmup import FormatWarmup

__all__ = [
    "CheckpointOnSigterm",
    "ContinuationReliability",
    "DecodeAgreement",
    "ExactResume",
    "FinalValidation",
    "FormatWarmup",
    "PassAtKEvaluation",
    "PromptLedger",
    "RolloutProgressBar",
    "RolloutTracker",
    "RunRecord",
    "ScriptedSFTWarmup",
]
