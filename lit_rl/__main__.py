"""``python -m lit_rl``: see :mod:`lit_rl.cli`."""

import sys

from lit_rl.cli import main

if __name__ == "__main__":
    sys.exit(main())
