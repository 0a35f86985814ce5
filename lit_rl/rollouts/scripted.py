"""Moved: the scripted solvers are :mod:`lit_rl.tasks.scripted`, found by task through :mod:`lit_rl.tasks.registry`
(``REGISTRY[task].traces``). The old names still resolve for one release, with a warning (:mod:`lit_rl.deprecation`).
"""

from types import ModuleType

from lit_rl.deprecation import moved_names
from lit_rl.tasks import scripted as _scripted

__getattr__ = moved_names(__name__, {
    **{name: "lit_rl.tasks.scripted" for name, value in vars(_scripted).items()
       if not name.startswith("_") and not isinstance(value, ModuleType)},
    "REGISTRY": "lit_rl.tasks.registry",
    "format_warmup_text": "lit_rl.tasks.registry",
})
