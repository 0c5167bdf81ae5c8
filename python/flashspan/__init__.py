"""flashspan: fused attention with per-row interval masks, planned once into a reusable MaskPlan."""

from __future__ import annotations

import importlib

from .api import flex_attn_func
from .execution import FlexAttentionBwd, FlexAttentionFwd
from .plan import MaskPlan, create_mask_plan

__version__ = "0.1.0"

__all__ = [
    "create_mask_plan",
    "MaskPlan",
    "flex_attn_func",
    "FlexAttentionFwd",
    "FlexAttentionBwd",
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
