"""lit_rl/models/frozen_state.py: 4-bit checkpoints leave the frozen NF4 base out."""

from __future__ import annotations


def test_frozen_4bit_lookup_does_not_import_bitsandbytes():
    """A checkpoint save of a model without 4-bit layers must not import bitsandbytes (1.5-2 s of start-up and a
    kernels warning on CPU machines): the lookup reads ``sys.modules``; the same call finds the layers once
    bitsandbytes is imported (the 4-bit fits of tests/models/test_pretrained.py and test_4bit_resume.py)."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from lit_rl.models.frozen_state import frozen_4bit_prefixes\n"
        "assert frozen_4bit_prefixes(torch.nn.Sequential(torch.nn.Linear(2, 2))) == []\n"
        "print('bitsandbytes' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
