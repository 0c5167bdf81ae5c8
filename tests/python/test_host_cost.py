"""benchmarks/host_cost.py (issue 24, "Host cost") runs on the CPU: every entry point, the table and the profile.

A subprocess: --stub-kernels patches classes of the script's own process."""

import importlib.util
import os
import subprocess
import sys

import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SCRIPT = os.path.join(_REPO, "benchmarks", "host_cost.py")


def _run(*args):
    try:
        import flashspan._lib as lib

        lib.lib()
    except ImportError as e:
        pytest.skip(f"libflashspan not built/loadable: {e}")
    env = dict(os.environ)
    # The flashspan under test (this checkout's python/ unless an installed copy shadows it, as in the tests).
    pkg = os.path.dirname(os.path.dirname(importlib.util.find_spec("flashspan").origin))
    env["PYTHONPATH"] = os.pathsep.join([pkg] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return subprocess.run([sys.executable, _SCRIPT, "--device", "cpu", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def test_host_cost_cpu_smoke():
    r = _run("--reps", "3", "--rounds", "1", "--warmup", "1", "--profile")
    assert r.returncode == 0, r.stdout + r.stderr
    for label in ("flashspan.flex_attn_func", "flex_attn_func (requires_grad)", "FlexAttentionFwd.execute",
                  "flashspan.sdpa", "torch.ops.flashspan.sdpa_fwd", "torch SDPA"):
        row = next((line for line in r.stdout.splitlines() if line.startswith(f"| {label} ")), None)
        assert row is not None and "FAILED" not in row, (label, r.stdout)
        assert float(row.split("|")[2]) > 0
    assert "cProfile of 3 calls of flashspan.flex_attn_func" in r.stdout


def test_host_cost_rejects_an_unknown_entry_point():
    r = _run("--stub-kernels", "--only", "nonsense")
    assert r.returncode == 2 and "--only: unknown entry point" in r.stderr
