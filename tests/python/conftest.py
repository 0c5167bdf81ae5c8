"""pytest setup: import flashspan from the repo when it is not installed; FLASHSPAN_LIBRARY picks the library."""

import contextlib
import importlib.util
import os
import sys
import warnings

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


def pytest_configure(config):
    config.addinivalue_line("markers", "no_poison: run without the poison_uninitialized fill (torch.compile tests)")


@contextlib.contextmanager
def uninitialized_memory_poisoned():
    """PyTorch's uninitialized-memory fill: while active, torch.empty / empty_like / new_empty /
    empty_strided return floating tensors full of NaN and integer ones full of their maximum (0xFF
    bytes for uint8 workspaces), on every device and for every allocation size (it acts on the
    tensor, not on the caching allocator). It needs deterministic-algorithms mode, switched on
    here with warn_only=True (ops without a deterministic variant warn, they do not fail); the
    previous settings are restored on exit."""
    import torch

    prev = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.utils.deterministic.fill_uninitialized_memory)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*(deterministic|CuBLAS|CUBLAS).*")
            yield
    finally:
        torch.use_deterministic_algorithms(prev[0], warn_only=prev[1])
        torch.utils.deterministic.fill_uninitialized_memory = prev[2]


@pytest.fixture
def poison_uninitialized(request):
    """Every output, gradient and workspace the library allocates starts as NaN / 0xFF during the test
    (uninitialized_memory_poisoned); tests marked no_poison run unchanged."""
    if request.node.get_closest_marker("no_poison"):
        yield
        return
    with uninitialized_memory_poisoned():
        yield
