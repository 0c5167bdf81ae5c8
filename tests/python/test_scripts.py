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
