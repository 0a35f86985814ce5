"""``python -m lit_rl.sweep``: the same as ``python -m lit_rl sweep``."""

import sys

from lit_rl.sweep import main

if __name__ == "__main__":
    sys.exit(main())
