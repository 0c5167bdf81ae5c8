"""Argument rules shared by flex_attn_func and the explicit API (the seed's exception types)."""

from __future__ import annotations

import math
import numbers
from typing import Optional

import torch


def check_flag(name: str, value, where: str) -> None:
    """TypeError unless ``value`` is a Python bool (the seed's rule: no silent ``bool()`` conversion)."""
    if type(value) is not bool:
        raise TypeError(f"{where}: {name}: must be a bool (True or False), got {type(value).__name__} {value!r}")


def check_softmax_scale(softmax_scale, where: str, return_max_logit: bool = False) -> Optional[float]:
    """None, or ``softmax_scale`` as a float; ValueError unless it is a finite real number (not a tensor),
    and unless it is >= 0 when the max logit is requested (the seed's rules)."""
    if softmax_scale is None:
        return None
    if type(softmax_scale) is float:  # the common case, without the numbers.Real (ABC) check
        if math.isfinite(softmax_scale) and (softmax_scale >= 0 or not return_max_logit):
            return softmax_scale
    elif isinstance(softmax_scale, torch.Tensor) or not isinstance(softmax_scale, numbers.Real):
        raise ValueError(
            f"{where}: softmax_scale: must be a finite number or None, got {type(softmax_scale).__name__}"
        )
    value = float(softmax_scale)
    if not math.isfinite(value):
        raise ValueError(f"{where}: softmax_scale: must be a finite number or None, got {value}")
    if return_max_logit and value < 0:
        raise ValueError(f"{where}: softmax_scale: must be non-negative when max_logit is requested, got {value}")
    return value
