"""Make the loopback OpenAI test server module (``openai_test_server.py``) importable by the tests here
(``--import-mode=importlib`` does not put test folders on ``sys.path``)."""

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
