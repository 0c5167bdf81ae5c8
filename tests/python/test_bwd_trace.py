"""benchmarks/bwd_trace.py (the sm90 backward's trace driver, PERF_LOG v2.44): its decoder and analysis on a
synthetic buffer (--selftest, CPU only), and its refusal of a library built without FLASHSPAN_BWD_TRACE."""

import os
import subprocess
import sys

import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SCRIPT = os.path.join(_REPO, "benchmarks", "bwd_trace.py")


def test_bwd_trace_selftest(tmp_path):
    r = subprocess.run([sys.executable, _SCRIPT, "--selftest", "--out", str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "selftest passed" in r.stdout, r.stdout + r.stderr
    assert (tmp_path / "selftest_writer.csv.gz").exists() and (tmp_path / "selftest_consumer.csv.gz").exists()


def test_bwd_trace_refuses_an_untraced_library():
    try:
        import flashspan._lib as lib

        handle = lib.lib()
    except ImportError as e:
        pytest.skip(f"libflashspan not built/loadable: {e}")
    if hasattr(handle, "flashspan_debug_bwd_trace_sm90"):
        pytest.skip("the loaded library is a FLASHSPAN_BWD_TRACE build")
    sys.path.insert(0, os.path.dirname(_SCRIPT))
    try:
        import bwd_trace
    finally:
        sys.path.pop(0)
    with pytest.raises(SystemExit, match="not a FLASHSPAN_BWD_TRACE build"):
        bwd_trace._hook()
