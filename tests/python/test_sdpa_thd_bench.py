"""benchmarks/sdpa_thd_bench.py's CPU smoke run (--device cpu: a tiny packed call on the CPU reference through the
script's three routes, each checked against the first; the forward and the backward): the script runs and prints its table."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


@pytest.mark.parametrize("extra", [[], ["--backward"]])
def test_cpu_smoke_prints_every_route(extra):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "sdpa_thd_bench.py"), "--device", "cpu", *extra],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert r.returncode == 0, r.stdout + r.stderr
    for route in ("sm80", "thd90", "pad90"):
        assert f"| {route} |" in r.stdout
    assert "FAIL" not in r.stdout
