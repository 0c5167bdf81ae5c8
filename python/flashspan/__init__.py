"""flashspan: fused attention with per-row interval masks (flex, planned into a MaskPlan) and SDPA with the cuDNN feature surface."""

from __future__ import annotations

import importlib

from .api import flex_attn_func
from .execution import FlexAttentionBwd, FlexAttentionFwd
from .plan import MaskPlan, create_mask_plan
from .sdpa import BOTTOM_RIGHT, TOP_LEFT, diagonal_alignment, dropout_offset_increment, sdpa, sdpa_backward
from .sdpa_fp8 import sdpa_fp8, sdpa_fp8_backward
from .sdpa_ops import sdpa_torch

__version__ = "0.1.0"

__all__ = [
    "create_mask_plan",
    "MaskPlan",
    "flex_attn_func",
    "FlexAttentionFwd",
    "FlexAttentionBwd",
    "sdpa",
    "sdpa_backward",
    "sdpa_fp8",
    "sdpa_fp8_backward",
    "sdpa_torch",
    "diagonal_alignment",
    "TOP_LEFT",
    "BOTTOM_RIGHT",
    "dropout_offset_increment",
    "masks",
    "__version__",
]


def __getattr__(name: str):
    # masks (mask builders) is imported on first use: it is optional for the core API.
    if name == "masks":
        module = importlib.import_module(".masks", __name__)
        globals()["masks"] = module
        return module
    raise AttributeError(f"module 'flashspan' has no attribute {name!r}")
