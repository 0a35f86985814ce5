"""Moved: the scripted solvers are :mod:`lit_rl.tasks.scripted`, found by task through :mod:`lit_rl.tasks.registry`
(``REGISTRY[task].traces``). The old names still resolve for one release, with a warning (:mod:`lit_rl.deprecation`).
"""

from lit_rl.deprecation import moved_names, old_names
from lit_rl.tasks import scripted as _scripted
from lit_rl.tasks.registry import REGISTRY as _REGISTRY

_HOMES = {
    **{name: "lit_rl.tasks.scripted" for name, value in vars(_scripted).items()  # its writers and their types
       if not name.startswith("_") and callable(value) and not isinstance(value, type(_scripted))},
    "REGISTRY": "lit_rl.tasks.registry",
    "format_warmup_text": "lit_rl.tasks.registry",
}
_COMPUTED = {  # task -> default trace writer, and task -> {style: writer}
    "SCRIPTED_POLICIES": (lambda: {n: e.default_trace for n, e in _REGISTRY.items() if e.traces},
                          "lit_rl.tasks.registry.REGISTRY[task].default_trace"),
    "TRACE_STYLES": (lambda: {n: dict(e.traces) for n, e in _REGISTRY.items() if e.traces},
                     "lit_rl.tasks.registry.known_traces(task)"),
}
__getattr__ = moved_names(__name__, _HOMES, _COMPUTED)
__all__ = old_names(_HOMES, _COMPUTED)
