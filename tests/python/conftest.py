"""pytest setup: import flashspan from the repo when it is not installed; FLASHSPAN_LIBRARY picks the library."""

import importlib.util
import os
import sys

import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_HERE = os.path.dirname(os.path.abspath(__file__))

if importlib.util.find_spec("flashspan") is None:
    sys.path.insert(0, os.path.join(_REPO, "python"))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)  # flex_ref.py (the math reference) lives next to the tests


def _package_line() -> str:
    """Which flashspan package is under test: an installed copy (what CI tests after pip install)
    silently shadows this checkout's python/, so say so."""
    spec = importlib.util.find_spec("flashspan")
    where = os.path.dirname(spec.origin) if spec and spec.origin else "?"
    line = f"flashspan package: {where}"
    if not os.path.abspath(where).startswith(os.path.join(_REPO, "python")):
        line += (f" (an installed copy, NOT this checkout; to test the checkout: "
                 f"PYTHONPATH={os.path.join(_REPO, 'python')})")
    return line


def pytest_report_header(config):
    package = _package_line()
    try:
        import flashspan._lib as lib

        return [
            f"flashspan: {lib.library_path()} (version {lib.version()}, CUDA available: {lib.cuda_available()}, "
            f"archs: {lib.built_cuda_archs() or 'none'}); FLASHSPAN_LIBRARY={os.environ.get('FLASHSPAN_LIBRARY', '')}",
            package,
        ]
    except ImportError as e:
        return [f"flashspan: library not loadable: {e}", package]


@pytest.fixture(scope="session")
def fs():
    """The flashspan package with its library loaded (tests that need the library use this)."""
    import flashspan
    import flashspan._lib as lib

    lib.lib()
    return flashspan


def cuda_ready() -> bool:
    """A CUDA device is visible to torch and the library was built with CUDA kernels."""
    import torch

    if not torch.cuda.is_available():
        return False
    try:
        import flashspan._lib as lib

        return lib.cuda_available()
    except ImportError:
        return False
