"""The config preflight: a ``fit`` / ``validate`` / ``test`` / ``predict`` command line checked before anything
is built, each problem one line naming the field, the file and the line (:func:`preflight`).

* :mod:`~lit_rl.config.lines` reads the YAML files and ``--key=value`` flags with the place of every key;
* :mod:`~lit_rl.config.signatures` reads a class's constructor arguments and their types;
* :mod:`~lit_rl.config.preflight` the checks.
"""

from lit_rl.config.preflight import preflight
from lit_rl.errors import ConfigError

__all__ = ["ConfigError", "preflight"]
