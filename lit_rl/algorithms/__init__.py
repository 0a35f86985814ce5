"""RL algorithms: the parts modules are built from (advantage processors, the SPG surrogate) and the
LightningModules. The pure math they call lives in :mod:`lit_rl.core` and is imported from there."""

from lit_rl.algorithms.advantages import (
    AdvantageProcessor,
    ExternalOnly,
    Joint,
    OnPolicyOnly,
    SourceSpecific,
)
from lit_rl.algorithms.surrogates import SPGSurrogate

__all__ = [
    "AdvantageProcessor",
    "ExternalOnly",
    "Joint",
    "OnPolicyOnly",
    "SourceSpecific",
    "SPGSurrogate",
]
