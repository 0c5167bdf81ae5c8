"""The scripts a new user runs first (scripts/main_job.sh, scripts/test.sh): what they print and promise."""

import os
import subprocess

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SCRIPTS = os.path.join(_REPO, "scripts")

# What `pip install -v` prints while scikit-build-core runs ninja: every line of the build is indented by two
# spaces (an excerpt of `pip wheel -v --no-build-isolation .` of this repository, scikit-build-core 1.1.2).
_PIP_VERBOSE = """\
Processing /work/wt-papercuts
  Running command Building wheel for flashspan (pyproject.toml)
  *** scikit-build-core 1.1.2 using CMake 3.25.1 (wheel)
  -- Build files have been written to: /tmp/pc/wheelbuild
  *** Building project with Ninja...
  [1/14] Building CXX object CMakeFiles/flashspan_obj.dir/src/api/guard.cpp.o
  [2/14] Building CXX object CMakeFiles/flashspan_obj.dir/src/api/sdpa_c_api.cpp.o
  /usr/include/c++/12/bits/stl_algo.h:1849:32: warning: array subscript 16 is outside array bounds
  [14/14] Creating library symlink libflashspan.so.0 libflashspan.so
  *** Installing project into wheel...
Successfully built flashspan
Installing collected packages: flashspan
Successfully installed flashspan-0.1.0
"""


def test_main_job_shows_ninja_progress_of_a_verbose_pip_install():
    """pip -v indents ninja's [n/N] lines; the filter matched only column 0, so a cold build showed nothing."""
    r = subprocess.run(["bash", os.path.join(_SCRIPTS, "build_progress.sh")], input=_PIP_VERBOSE,
                       capture_output=True, text=True, check=True)
    assert r.stdout.splitlines() == [
        "[1/14] Building CXX object CMakeFiles/flashspan_obj.dir/src/api/guard.cpp.o",
        "[2/14] Building CXX object CMakeFiles/flashspan_obj.dir/src/api/sdpa_c_api.cpp.o",
        "[14/14] Creating library symlink libflashspan.so.0 libflashspan.so",
        "Successfully installed flashspan-0.1.0",
    ]
    # main_job.sh pipes the install through that filter.
    assert "build_progress.sh" in open(os.path.join(_SCRIPTS, "main_job.sh")).read()


def _case(name, status, out="", skipped=False):
    skip = '<skipped message="SKIP_REGULAR_EXPRESSION_MATCHED"/>' if skipped else ""
    return (f'<testcase name="{name}" classname="{name}" time="0.01" status="{status}">{skip}'
            f"<system-out>{out}</system-out></testcase>")


def test_ctest_summary_says_how_many_were_skipped_and_why(tmp_path):
    """ctest ends with "100% tests passed ... out of 186" on a CPU machine where 78 of them skipped (the GPU
    tests): scripts/test.sh now prints a summary with the skipped count and their reasons."""
    gpu = "[ RUN      ] FlexGpu.Causal\n/x/gpu_harness.h:28: Skipped\nno CUDA device is visible\n[  SKIPPED ] FlexGpu.Causal"
    nocuda = "/x/test_flex_gpu.cpp:52: Skipped\nflashspan was built without CUDA\n[  SKIPPED ] FlexGpu.Skipped"
    cases = ([_case(f"Planner.T{i}", "run", "[       OK ] Planner.T") for i in range(3)]
             + [_case(f"FlexGpu.G{i}", "notrun", gpu, skipped=True) for i in range(2)]
             + [_case("FlexGpu.Skipped", "notrun", nocuda, skipped=True)])
    junit = tmp_path / "ctest.xml"
    junit.write_text(f'<?xml version="1.0" encoding="UTF-8"?>\n<testsuite name="(empty)" tests="6" failures="0" '
                     f'skipped="3">{"".join(cases)}</testsuite>')
    r = subprocess.run(["python3", os.path.join(_SCRIPTS, "ctest_summary.py"), str(junit)], capture_output=True,
                       text=True, check=True)
    lines = r.stdout.splitlines()
    assert lines[0] == "C++ tests (ctest): 6 tests, 3 passed, 3 skipped, 0 failed", r.stdout
    assert "  2 skipped: no CUDA device is visible" in lines
    assert "  1 skipped: flashspan was built without CUDA" in lines
    assert any("not a full run" in line for line in lines), r.stdout
    # scripts/test.sh writes the report and prints the summary after ctest.
    test_sh = open(os.path.join(_SCRIPTS, "test.sh")).read()
    assert "--output-junit" in test_sh and "ctest_summary.py" in test_sh


def test_time_estimates_are_measured_figures_with_their_machine():
    """The README's estimates were off both ways (test command 13 min 19 s measured vs "20-30 minutes", a cold
    main job 5 min 26 s vs the script's "about 2 minutes", the emulated planner tests about 3 min vs "~2 min").
    Now the README gives measured figures with the machine, and the scripts point there."""
    import re

    readme = open(os.path.join(_REPO, "README.md")).read()
    start = readme.index("### Measured times")
    end = readme.find("\n## ", start)
    section = readme[start:end]
    assert re.search(r"Measured on .*\d+ cores", section), section  # the machine they were measured on
    for what in ("`test.sh`", "`main_job.sh`", "emulated planner tests", "CMake build"):
        row = next((line for line in section.splitlines() if line.startswith("|") and what in line), None)
        assert row is not None and re.search(r"\d+ min \d+ s|\d+ s\b", row), (what, row)
    assert "20-30 minutes" not in readme
    # The scripts and TESTING.md point to those figures instead of keeping estimates of their own.
    testing = open(os.path.join(_REPO, "docs", "TESTING.md")).read()
    places = {p: open(os.path.join(_REPO, p)).read() for p in
              ("scripts/main_job.sh", "scripts/test.sh", "tests/emu/run_planner_emu.sh")}
    places["docs/TESTING.md (test.sh row)"] = next(line for line in testing.splitlines() if "scripts/test.sh`" in line)
    for where, text in places.items():
        assert not re.search(r"(about|~)\s*\d+(-\d+)?\s*min", text), where
        assert "Measured times" in text, where
