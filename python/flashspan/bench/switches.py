"""Environment switches for benchmark scripts: flashspan reads its route switches per call (docs/SDPA.md), so a
script compares routes in one process by setting the variables around the calls."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, Optional


@contextlib.contextmanager
def scoped_env(**values: Optional[str]) -> Iterator[None]:
    """Sets each variable NAME=value for the calls inside (None: unset), then restores what was there before.

    Example: ``with scoped_env(FLASHSPAN_SM90_SDPA_PAGED="0"): ...`` runs paged calls on the sm80 paged kernel."""
    saved = {k: os.environ.get(k) for k in values}
    try:
        _put_env(values)
        yield
    finally:
        _put_env(saved)


def _put_env(values: dict) -> None:
    """Sets each variable NAME=value (None: unsets it)."""
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
