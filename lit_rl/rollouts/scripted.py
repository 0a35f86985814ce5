"""The scripted solvers moved to :mod:`lit_rl.tasks.scripted` (their tasks' registry entries name them,
:mod:`lit_rl.tasks.registry`); this module keeps the old imports working."""

from lit_rl.tasks.registry import REGISTRY, format_warmup_text  # noqa: F401
from lit_rl.tasks.scripted import *  # noqa: F401,F403

#: ``task -> default trace writer`` and ``task -> {style: writer}``, from the registry
SCRIPTED_POLICIES = {n: e.default_trace for n, e in REGISTRY.items() if e.traces}
TRACE_STYLES = {n: dict(e.traces) for n, e in REGISTRY.items() if e.traces}
